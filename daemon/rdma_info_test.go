package daemon

import (
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// rdmaPeer is id's row in info, or false.
func rdmaPeer(info client.RDMAInfo, id string) (client.RDMAPeer, bool) {
	for _, p := range info.Peers {
		if p.ID == id {
			return p, true
		}
	}
	return client.RDMAPeer{}, false
}

// TestVerbsRDMAInfo: in the Soft-RoCE VM, what tcctl rdma reports is the
// device, port and GID the VM set up, the pool's registration, and, once a
// transfer has brought the link up, rdma as d1's transport at d2 (and d2's
// link accepted at d1), which a transfer moving nothing over tcp confirms.
func TestVerbsRDMAInfo(t *testing.T) {
	testutil.Require(t, testutil.RDMA)
	dev := os.Getenv("RXE_DEV")
	gidIndex, err := strconv.Atoi(os.Getenv("RXE_GID_INDEX"))
	if err != nil {
		t.Fatalf("RXE_GID_INDEX %q: %v", os.Getenv("RXE_GID_INDEX"), err)
	}
	ip, err := netip.ParseAddr(os.Getenv("RXE_IP"))
	if err != nil {
		t.Fatalf("RXE_IP %q: %v", os.Getenv("RXE_IP"), err)
	}
	port := 1
	if s := os.Getenv("RXE_PORT"); s != "" {
		if port, err = strconv.Atoi(s); err != nil {
			t.Fatalf("RXE_PORT %q: %v", s, err)
		}
	}
	p := startRDMAPair(t, "on")
	info, err := p.wr.RDMA()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("d2 before any transfer: %+v", info)
	wantGID := netip.AddrFrom16(ip.As16()).String()
	if info.State != client.RDMAEnabled || info.Reason != "" || info.Device != dev || int(info.Port) != port ||
		info.GID != wantGID || int(info.GIDIndex) != gidIndex || info.MTU < 256 ||
		info.PoolRegistered != uint64(p.d2.cfg.PoolSize) || info.PoolMRs < 1 {
		t.Fatalf("d2 reports %+v; want device %s port %d, gid %s (index %d), a %d-byte pool registered",
			info, dev, port, wantGID, gidIndex, p.d2.cfg.PoolSize)
	}
	if d1, ok := rdmaPeer(info, "d1"); !ok || d1.Transport != "tcp" || d1.Link != "none" {
		t.Fatalf("before any transfer d2 reports d1 as %+v (listed %v); want tcp, no link", d1, ok)
	}

	// The first requests go over tcp and have the link set up behind them.
	rng := rand.New(rand.NewPCG(3, 3))
	var d1 client.RDMAPeer
	testutil.Eventually(t, 20*time.Second, func() bool {
		if err := p.roundTrip(rng, 4096, 0); err != nil {
			t.Fatal(err)
		}
		if info, err = p.wr.RDMA(); err != nil {
			t.Fatal(err)
		}
		d1, _ = rdmaPeer(info, "d1")
		return d1.Transport == "rdma"
	}, "d2 reporting d1 on rdma; reports %+v:\n%s", testutil.Lazy(func() client.RDMAPeer { return d1 }), p.d2.log)
	epoch1 := p.d1.d.peers.Node().Epoch()
	if d1.Link != "up" || d1.Epoch == 0 || d1.Epoch != epoch1 || d1.QueuePairs == 0 || d1.Segments < 1 {
		t.Fatalf("d2 reports d1 as %+v; want link up at d1's epoch %#x with queue pairs and the export resolved", d1, epoch1)
	}
	t.Logf("d2 once the link is up: %+v", info)
	before := tcpBytes(p.d2)
	if err := p.roundTrip(rng, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	if moved := tcpBytes(p.d2) - before; moved != 0 {
		t.Fatalf("reported rdma, but 1 MiB each way moved %d bytes over tcp", moved)
	}

	exp, err := p.exp.RDMA()
	if err != nil {
		t.Fatal(err)
	}
	epoch2 := p.d2.d.peers.Node().Epoch()
	if d2, ok := rdmaPeer(exp, "d2"); !ok || !d2.Accepting || d2.AcceptedEpoch != epoch2 || d2.Link != "none" {
		t.Fatalf("d1 reports d2 as %+v (listed %v); want d2's link accepted at its epoch %#x, none of d1's own", d2, ok, epoch2)
	}
	if exp.Device != dev || exp.GID != wantGID {
		t.Fatalf("d1 reports device %s gid %s", exp.Device, exp.GID)
	}
}
