package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/daemon"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/wire"
)

type fakeRDMA struct{ info wire.RDMAResponse }

func (f fakeRDMA) RDMAInfo() wire.RDMAResponse { return f.info }

// TestRDMATable: an enabled plane prints its device, port, GID and
// registration, and a row per peer with its transport and link.
func TestRDMATable(t *testing.T) {
	info := wire.RDMAResponse{State: wire.RDMAEnabled, Device: "rxe0", Port: 1, GID: "::ffff:10.0.2.15", GIDIndex: 1,
		MTU: 1024, PoolRegistered: 64 << 20, PoolMRs: 1, Peers: []wire.RDMAPeer{
			{ID: "decode-1", Transport: "rdma", Link: "up", Epoch: 0xabc, QueuePairs: 2, Segments: 3, Accepting: true, AcceptedEpoch: 0xdef},
			{ID: "decode-2", Transport: "tcp", Link: "failed"},
		}}
	sock := startDaemonDeps(t, func(d *control.Deps) { d.RDMA = fakeRDMA{info} })
	code, out, errs := tcctl(t, nil, "--socket", sock, "rdma")
	if code != 0 {
		t.Fatalf("rdma: %d %q", code, errs)
	}
	for _, want := range []string{"state:    enabled", "device:   rxe0 port 1", "gid:      ::ffff:10.0.2.15 (index 1)",
		"mtu:      1024", "pool:     64MiB registered, 1 MRs"} {
		if !strings.Contains(out, want) {
			t.Fatalf("rdma output lacks %q:\n%s", want, out)
		}
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "decode-") {
			rows[f[0]] = f
		}
	}
	if r := rows["decode-1"]; strings.Join(r, " ") != "decode-1 rdma up 0xabc 2 3 epoch 0xdef" {
		t.Fatalf("decode-1 row %q:\n%s", r, out)
	}
	if r := rows["decode-2"]; strings.Join(r, " ") != "decode-2 tcp failed - - 0 no" {
		t.Fatalf("decode-2 row %q:\n%s", r, out)
	}
	if code, _, _ := tcctl(t, nil, "--socket", sock, "rdma", "extra"); code != 2 {
		t.Fatalf("rdma with an argument: exit %d", code)
	}
}

// startRealDaemon runs a tensorcastd on 127.0.0.1 with rdma set to mode;
// peers false leaves the peer plane off.
func startRealDaemon(t *testing.T, mode string, peers bool) string {
	t.Helper()
	_, cfg := startTensorcastd(t, func(c *daemon.Config) {
		c.DaemonID = "host-a"
		c.RDMA = mode
		c.MetricsAddress = "127.0.0.1:0"
		if peers {
			c.PeerListen, c.ClusterKeyFile = "127.0.0.1:0", testutil.KeyFile(t, t.TempDir(), "cluster.key", "tcctl directory test key")
		}
	})
	return cfg.Socket
}

// TestRDMAOffOrUnavailable: a real daemon without RDMA says which state
// it is in and why, through the client and through tcctl.
func TestRDMAOffOrUnavailable(t *testing.T) {
	cases := []struct {
		name, mode string
		peers      bool
		state      wire.RDMAState
		reason     string
	}{
		{"rdma = off", "off", true, client.RDMAOff, "rdma = off"},
		{"no peer plane", "auto", false, client.RDMAOff, "peer_listen is not set"},
	}
	// rdma = auto on a host without a usable device: the reason is the
	// error opening one.
	if dev, err := rdma.Open(rdma.Config{}, slog.New(slog.DiscardHandler)); err != nil {
		cases = append(cases, struct {
			name, mode string
			peers      bool
			state      wire.RDMAState
			reason     string
		}{"rdma = auto without a device", "auto", true, client.RDMAUnavailable, err.Error()})
	} else {
		dev.Close()
		t.Log("this host has an RDMA device: the unavailable case is not tried (TestVerbsRDMAInfo covers enabled)")
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := startRealDaemon(t, tc.mode, tc.peers)
			c, err := client.Dial(sock, client.Options{Name: "rdma-test", NoPool: true})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r, err := c.RDMA()
			if err != nil {
				t.Fatal(err)
			}
			if r.State != tc.state || !strings.Contains(r.Reason, tc.reason) || r.Device != "" || len(r.Peers) != 0 {
				t.Fatalf("state %s, reason %q, device %q, %d peers; want %s with %q", r.State, r.Reason, r.Device, len(r.Peers), tc.state, tc.reason)
			}
			code, out, errs := tcctl(t, nil, "--socket", sock, "rdma")
			want := "state:    " + strings.ToLower(tc.state.String()) + "\nreason:   " + r.Reason + "\n"
			if code != 0 || out != want {
				t.Fatalf("tcctl rdma: %d %q %q, want %q", code, out, errs, want)
			}
			t.Logf("tcctl rdma:\n%s", out)
		})
	}
}
