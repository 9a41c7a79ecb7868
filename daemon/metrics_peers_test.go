package daemon

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestPeerMetrics: two daemons, a known number of WRITEs to a peer's
// export over tcp; the writer's scrape shows them under transport="tcp"
// and the peer's series. As root the tcp eBPF view loads too.
func TestPeerMetrics(t *testing.T) {
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast metrics test key")
	ebpf := func(c *Config) {
		c.RDMA = "off"
		if os.Geteuid() == 0 {
			c.EBPF = "auto"
		}
	}
	d1 := startPeerWith(t, "d1", key, "", ebpf, PeerConfig{ID: "d2"}) // d2 dials in
	d2 := startPeerWith(t, "d2", key, "", ebpf, d1.peer())
	a := d1.dial(t, "exporter")
	abuf, err := a.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ExportSegment("kv", abuf.ID, 0, 0, client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	b := d2.dial(t, "writer")
	rs, err := b.OpenRemote("d1/kv", client.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	bbuf, err := b.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	const n, size = 4, 64 << 10
	reqs := make([]xfer.Request, n)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: bbuf.ID, LocalOffset: uint64(i * size), Target: rs.ID, TargetOffset: uint64(i * size), Length: size}
	}
	res := make([]error, n)
	if s, err := b.Transfer(reqs, 10*time.Second, res); err != nil || int(s.Completed) != n {
		t.Fatalf("transfer: %+v %v %v", s, err, res)
	}
	exp := scrapeMetrics(t, d2.d.MetricsAddr())
	for series, want := range map[string]float64{
		`tensorcast_transport_requests_total{transport="tcp"}`:        n,
		`tensorcast_transport_bytes_total{transport="tcp"}`:           n * size,
		`tensorcast_transport_in_flight{transport="tcp"}`:             0,
		`tensorcast_peer_connected{peer="d1"}`:                        1,
		`tensorcast_peer_errors_total{peer="d1"}`:                     0,
		`tensorcast_peer_connections{direction="outbound",peer="d1"}`: float64(d2.cfg.PeerConns),
		// rdma = off: requests go over tcp, which is no fallback.
		`tensorcast_peer_link_state{peer="d1",state="tcp"}`:          1,
		`tensorcast_peer_link_state{peer="d1",state="tcp_fallback"}`: 0,
		`tensorcast_peer_link_state{peer="d1",state="rdma"}`:         0,
		`tensorcast_peer_link_state{peer="d1",state="down"}`:         0,
	} {
		if got := sample(t, exp, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if got := sample(t, exp, `tensorcast_transport_latency_seconds_count{transport="tcp"}`); got > n {
		t.Errorf("tcp latency count %v, more than the %d requests (it is a sample of the calls)", got, n)
	}
	if got := sample(t, exp, `tensorcast_peer_sent_bytes_total{peer="d1"}`); got < n*size {
		t.Errorf("sent bytes %v, want at least %d", got, n*size)
	}
	if !strings.Contains(exp, `tensorcast_peer_info{addr="`+d1.d.PeerAddr()+`",epoch="0x`) {
		t.Errorf("no peer_info with d1's address and epoch")
	}
	if os.Geteuid() == 0 {
		loaded := sample(t, exp, `tensorcast_ebpf_view_loaded{view="tcp"}`)
		t.Logf("tcp eBPF view loaded: %v (the daemon log says why not)", loaded)
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", exp)
	}
	// d1 goes: its link is down.
	if err := d1.stop(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		exp = scrapeMetrics(t, d2.d.MetricsAddr())
		return sample(t, exp, `tensorcast_peer_link_state{peer="d1",state="down"}`) == 1
	}, "d1's link down in d2's scrape:\n%s", testutil.Lazy(func() string { return exp }))
	if got := sample(t, exp, `tensorcast_peer_link_state{peer="d1",state="tcp"}`); got != 0 {
		t.Fatalf("d1 down and on tcp at once: %v", got)
	}
}

func TestLinkState(t *testing.T) {
	for _, tc := range []struct {
		connected bool
		plane     wire.RDMAState
		peer      *wire.RDMAPeer
		want      string
	}{
		{false, wire.RDMAEnabled, &wire.RDMAPeer{Transport: "rdma", Link: "up"}, "down"},
		{true, wire.RDMAEnabled, &wire.RDMAPeer{Transport: "rdma", Link: "up"}, "rdma"},
		{true, wire.RDMAEnabled, &wire.RDMAPeer{Transport: "tcp", Link: "failed"}, "tcp_fallback"},
		{true, wire.RDMAEnabled, &wire.RDMAPeer{Transport: "tcp", Link: "up"}, "tcp_fallback"}, // not chosen yet
		{true, wire.RDMAEnabled, nil, "tcp_fallback"},
		{true, wire.RDMAOff, nil, "tcp"},
		{true, wire.RDMAUnavailable, nil, "tcp"},
		{false, wire.RDMAOff, nil, "down"},
	} {
		if got := linkState(tc.connected, tc.plane, tc.peer); got != tc.want {
			t.Errorf("linkState(%v, %v, %+v) = %s, want %s", tc.connected, tc.plane, tc.peer, got, tc.want)
		}
	}
}
