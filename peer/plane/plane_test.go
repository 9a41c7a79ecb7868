package plane

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/rdma/link"
	"github.com/tensorcast/tensorcast/rdma/rdmatest"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// The RDMA links' own tests, over an rdmatest fabric and over real verbs,
// are package rdma/link's; these check what the plane adds: the choice
// of RDMA at start-up and what it reports.

func TestMain(m *testing.M) { testutil.Main(m) }

// TestRDMAInfoReason: a plane without RDMA reports why, whatever level it
// logs at; rdma = on without a device fails New (nothing is left
// listening), auto without one reports the device's error.
func TestRDMAInfoReason(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rp, why, err := link.New(RDMAConfig{Mode: "off"}, nil, nil, nil, log)
	if err != nil || rp != nil || why != "rdma = off" {
		t.Fatalf("rdma = off: plane %v, %q, err %v", rp, why, err)
	}
	if buf.Len() != 0 {
		t.Fatalf("an Info record passed a Warn logger:\n%s", buf.String())
	}
	if r := NoPlane.RDMAInfo(); r.State != wire.RDMAOff || !strings.Contains(r.Reason, "peer_listen") {
		t.Fatalf("without a peer plane: %s, %q", r.State, r.Reason)
	}
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast peer plane test key")
	node := tcp.Config{DaemonID: "d1", Listen: "127.0.0.1:0", ClusterKeyFile: key}
	noDevice := func(rdma.Config, *slog.Logger) (Device, error) { return nil, rdma.ErrNoDevice }
	off, err := New(Config{Node: node, RDMA: RDMAConfig{Mode: "off"}}, peer.NewExports(nil), log)
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	if r := off.RDMAInfo(); r.State != wire.RDMAOff || r.Reason != "rdma = off" {
		t.Fatalf("a plane with rdma = off reports %s, %q", r.State, r.Reason)
	}
	if c := off.Counters(nil); len(c) != 0 {
		t.Fatalf("counters without RDMA: %v", c)
	}
	auto, err := New(Config{Node: node, RDMA: RDMAConfig{Mode: "auto", Open: noDevice}}, peer.NewExports(nil), log)
	if err != nil {
		t.Fatal(err)
	}
	defer auto.Close()
	if r := auto.RDMAInfo(); r.State != wire.RDMAUnavailable || !strings.Contains(r.Reason, "no RDMA device") {
		t.Fatalf("rdma = auto without a device reports %s, %q", r.State, r.Reason)
	}
	if m := auto.Member(); m.RDMA != nil || slices.Contains(m.Caps, "rdma") || m.ID != "d1" || m.Addr != auto.Node().Addr() {
		t.Fatalf("member without RDMA: %+v", m)
	}
	if _, err := New(Config{Node: node, RDMA: RDMAConfig{Mode: "on", Open: noDevice}}, peer.NewExports(nil), log); !errors.Is(err, ErrRDMARequired) ||
		!strings.Contains(err.Error(), "rdma = on") {
		t.Fatalf("rdma = on without a device: %v", err)
	}
}

// TestMemberWithRDMA: a plane whose device is usable lists itself with
// its RDMA addressing and the rdma capability, and reports the device.
func TestMemberWithRDMA(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	pool, err := shm.NewPool(shm.PoolConfig{ID: 1, Name: "d1", Size: 8 << 20, Hugepages: shm.HugepagesOff}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	fab := rdmatest.NewFabric()
	open := func(c rdma.Config, log *slog.Logger) (Device, error) { return fab.Open("d1", c, log), nil }
	node := tcp.Config{DaemonID: "d1", Listen: "127.0.0.1:0", ClusterKeyFile: testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast peer plane test key")}
	p, err := New(Config{Node: node, RDMA: RDMAConfig{Mode: "on", Open: open}, Pools: []xfer.MemSegment{pool}}, peer.NewExports(nil), log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if m := p.Member(); m.RDMA == nil || !slices.Contains(m.Caps, "rdma") || m.Epoch != p.Node().Epoch() {
		t.Fatalf("member with RDMA: %+v", m)
	}
	if r := p.RDMAInfo(); r.State != wire.RDMAEnabled || r.PoolRegistered != 8<<20 {
		t.Fatalf("RDMA report: %+v", r)
	}
}

// TestDeliverNeedsWrite: a peer's notification reaches an export's
// subscribers only while the export grants write access. A peer may still
// hold a write token for the name from an earlier read-write export of it
// (tokens outlive an unexport); the read-only export now under that name
// must not take its notifications.
func TestDeliverNeedsWrite(t *testing.T) {
	exports := peer.NewExports(nil)
	buf := xfertest.SegmentOf(7, xfer.KindClient, make([]byte, 4096))
	x := nodeExports{exports}
	in := peer.NewInbox("connection 1", 8)
	defer in.Close()

	rw, err := exports.Export("kv", "", buf, 0, 4096, wire.RightRead|wire.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := exports.Subscribe("kv", "", in); err != nil {
		t.Fatal(err)
	}
	if err := x.Deliver(tcp.Access{Name: "kv"}, []byte("v1")); err != nil || in.Len() != 1 {
		t.Fatalf("a notification into a read-write export: %v, %d queued", err, in.Len())
	}
	rw.End(0)

	if _, err := exports.Export("kv", "", buf, 0, 4096, wire.RightRead); err != nil {
		t.Fatal(err)
	}
	if err := exports.Subscribe("kv", "", in); err != nil {
		t.Fatal(err)
	}
	if err := x.Deliver(tcp.Access{Name: "kv"}, []byte("v2")); !errors.Is(err, xfer.ErrPermission) || in.Len() != 1 {
		t.Fatalf("a notification into a read-only export: %v, %d queued; want xfer.ErrPermission and nothing queued", err, in.Len())
	}
}
