//go:build linux && cgo

package rdma

import (
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// daemonSide is what one daemon holds for RDMA in this test: its tcp node,
// its pool (registered once) and, per peer, the transport it dials with and
// the one that accepts the peer's queue pairs (created on first use).
type daemonSide struct {
	node *tcp.Node
	d    *Device
	pool []byte
	reg  *Region

	mu       sync.Mutex // guards accepted
	accepted map[string]*Transport
}

func (s *daemonSide) lookup(from string, epoch uint64) (*Transport, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.accepted[from]; t != nil {
		return t, nil
	}
	t, err := s.d.NewTransport()
	if err != nil {
		return nil, err
	}
	t.Expose(1, s.reg)
	s.accepted[from] = t
	return t, nil
}

func (s *daemonSide) close(tb testing.TB) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, t := range s.accepted {
		if err := t.Close(); err != nil {
			tb.Errorf("closing the transport accepting %s: %v", id, err)
		}
	}
}

// TestVerbsPeerChannelCRC: two daemons' worth of tcp nodes and transports
// in one process set their queue pairs up through the peer channel's
// exchange (each dials the other) and move data by RDMA WRITE and READ
// between their pools, crc32c checked, at 4 KiB, 1 MiB and 16 MiB.
func TestVerbsPeerChannelCRC(t *testing.T) {
	const size = 40 << 20
	d := openDevice(t, Config{QPs: 2})
	host := os.Getenv("RXE_IP")
	if host == "" {
		host = "127.0.0.1"
	}
	key := testutil.KeyFile(t, t.TempDir(), "key", "cluster-secret")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sides := map[string]*daemonSide{}
	for _, id := range []string{"alpha", "bravo"} {
		s := &daemonSide{d: d, pool: mmapBuf(t, size), accepted: map[string]*Transport{}}
		s.reg = register(t, d, s.pool)
		n, err := tcp.NewNode(tcp.Config{DaemonID: id, Listen: host + ":0", ClusterKeyFile: key, ConnsPerPeer: 1}, noExports{}, log)
		if err != nil {
			t.Fatal(err)
		}
		s.node = n
		if err := n.Handle(ExchangeKind, Acceptor(s.lookup)); err != nil {
			t.Fatal(err)
		}
		sides[id] = s
	}
	// Stop order: tcp nodes first (no more exchanges), then the
	// transports; the regions and the device go in their own cleanups.
	t.Cleanup(func() {
		for _, s := range sides {
			s.node.Close()
		}
		for _, s := range sides {
			s.close(t)
		}
	})
	for id, s := range sides {
		for oid, o := range sides {
			if oid != id {
				if err := s.node.Directory().Update(directory.Peer{ID: oid, Addr: o.node.Addr()}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	const poolSeg, peerSeg xfer.SegmentID = 1, 2
	for _, pair := range [][2]string{{"alpha", "bravo"}, {"bravo", "alpha"}} {
		me, peer := sides[pair[0]], sides[pair[1]]
		t.Run(pair[0]+"→"+pair[1], func(t *testing.T) {
			tr, err := d.NewTransport()
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := tr.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			segs := xfertest.Segments{}
			segs.Set(t, poolSeg, xfer.SlotRDMA, LocalKeys(me.reg, nil, nil))
			start := time.Now()
			if err := tr.Connect(ChannelPeer{Ch: me.node, ID: pair[1], Timeout: 10 * time.Second}); err != nil {
				t.Fatalf("Connect over the peer channel: %v", err)
			}
			t.Logf("queue pairs up through the peer channel in %v", time.Since(start))
			regs := tr.PeerRegions()
			if len(regs) != 1 || regs[0].Size != size {
				t.Fatalf("peer regions %+v", regs)
			}
			// The target is a window of the peer's pool, as an export is.
			const winOff = 4<<20 + 512
			win, err := RemoteRangeKeys(regs[0], winOff, size-winOff, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			segs.Set(t, peerSeg, xfer.SlotRDMA, win)
			rng := rand.New(rand.NewPCG(uint64(pair[0][0]), 3))
			for _, n := range []int{4 << 10, 1 << 20, 16 << 20} {
				t.Run(strconv.Itoa(n>>10)+"KiB", func(t *testing.T) {
					for i := range me.pool[:n] {
						me.pool[i] = byte(rng.Uint32())
					}
					want := crc32.Checksum(me.pool[:n], castagnoli)
					toff := uint64(size - winOff - n - 4096)
					r := newRecorder()
					w := segs.Tasks(r, xfer.Request{Op: xfer.OpWrite, Local: poolSeg, Target: peerSeg, TargetOffset: toff, Length: uint64(n)})
					t0 := time.Now()
					run(t, tr, r, w)
					wdur := time.Since(t0)
					if err := r.Err(w[0]); err != nil || r.N(w[0]) != uint64(n) {
						t.Fatalf("WRITE: n %d, %v", r.N(w[0]), err)
					}
					at := winOff + toff
					if got := crc32.Checksum(peer.pool[at:at+uint64(n)], castagnoli); got != want {
						t.Fatalf("WRITE: crc32c %08x in the peer's pool, %08x sent", got, want)
					}
					loff := uint64(size - n)
					clear(me.pool[loff:])
					rd := segs.Tasks(r, xfer.Request{Op: xfer.OpRead, Local: poolSeg, LocalOffset: loff, Target: peerSeg, TargetOffset: toff, Length: uint64(n)})
					t0 = time.Now()
					run(t, tr, r, rd)
					rdur := time.Since(t0)
					if err := r.Err(rd[0]); err != nil || r.N(rd[0]) != uint64(n) {
						t.Fatalf("READ: n %d, %v", r.N(rd[0]), err)
					}
					if got := crc32.Checksum(me.pool[loff:loff+uint64(n)], castagnoli); got != want {
						t.Fatalf("READ: crc32c %08x read back, %08x written", got, want)
					}
					t.Logf("%d KiB: write %v, read %v, crc32c %08x", n>>10, wdur, rdur, want)
				})
			}
		})
	}
	for id, s := range sides {
		s.mu.Lock()
		k := len(s.accepted)
		s.mu.Unlock()
		if k != 1 {
			t.Errorf("%s accepts with %d transports; want one for its one peer", id, k)
		}
	}
}
