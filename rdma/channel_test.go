package rdma

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
)

// directChannel is an Exchanger that calls the named peer's handler in
// this process, as daemon "alpha" at epoch 7.
type directChannel map[string]func(from string, epoch uint64, req []byte) ([]byte, error)

func (c directChannel) Exchange(peer, kind string, req []byte, _ time.Duration) ([]byte, error) {
	h := c[peer+"/"+kind]
	if h == nil {
		return nil, fmt.Errorf("no handler %s/%s", peer, kind)
	}
	return h("alpha", 7, req)
}

// exposedPair builds two fake transports: b exposes rb as region 42; a
// has la as segLocal and is not connected yet.
func exposedPair(t *testing.T, la, rb []byte) (a, b *fakeSide) {
	t.Helper()
	a, b = newFakeSide(t, Config{QPs: 2}), newFakeSide(t, Config{QPs: 2})
	t.Cleanup(func() { a.t.Close(); b.t.Close() })
	lt, err := newKeyTable(addrOf(la), uint64(len(la)), 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	a.t.AddLocal(segLocal, &Region{keys: lt})
	rt, err := newKeyTable(addrOf(rb), uint64(len(rb)), 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	b.t.Expose(42, &Region{keys: rt})
	return a, b
}

// moveAndCheck writes la[:n] to target segment seg at offset 0, reads it
// back into la[n:2n] and compares.
func moveAndCheck(t *testing.T, a *fakeSide, seg xfer.SegmentID, la []byte, n uint64) {
	t.Helper()
	r := newRecorder()
	w := tasksOf(r, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: seg, Length: n})
	if k, err := a.t.Submit(w); k != 1 || err != nil {
		t.Fatalf("Submit write = %d, %v", k, err)
	}
	r.wait(t, 1)
	rd := tasksOf(r, xfer.Request{Op: xfer.OpRead, Local: segLocal, LocalOffset: n, Target: seg, Length: n})
	if k, err := a.t.Submit(rd); k != 1 || err != nil {
		t.Fatalf("Submit read = %d, %v", k, err)
	}
	r.wait(t, 1)
	for _, tk := range append(w, rd...) {
		if r.errs[tk] != nil || r.n[tk] != n {
			t.Fatalf("task %+v: n %d err %v", tk.Req, r.n[tk], r.errs[tk])
		}
	}
	if !bytes.Equal(la[:n], la[n:2*n]) {
		t.Fatal("bytes read back differ from those written")
	}
}

func TestChannelPeerOverFakes(t *testing.T) {
	la, rb := pattern(1<<20, 5), make([]byte, 1<<20)
	a, b := exposedPair(t, la, rb)
	var seen []string
	ch := directChannel{"bravo/" + ExchangeKind: Acceptor(func(from string, epoch uint64) (*Transport, error) {
		seen = append(seen, fmt.Sprintf("%s@%d", from, epoch))
		return b.t, nil
	})}
	if err := a.t.Connect(ChannelPeer{Ch: ch, ID: "bravo"}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[0] != "alpha@7" {
		t.Fatalf("acceptor saw %v; want one exchange per queue pair from alpha@7", seen)
	}
	regs := a.t.PeerRegions()
	if len(regs) != 1 || regs[0].Name != 42 || regs[0].Size != uint64(len(rb)) {
		t.Fatalf("learned regions %+v", regs)
	}
	if err := a.t.AddRemote(segRemote, regs[0]); err != nil {
		t.Fatal(err)
	}
	moveAndCheck(t, a, segRemote, la, 200<<10)
	if !bytes.Equal(rb[:200<<10], la[:200<<10]) {
		t.Fatal("target bytes differ")
	}

	// A window of the region: target offset 0 is byte 300 KiB + 5 of rb.
	const win xfer.SegmentID = 3
	if err := a.t.AddRemoteRange(win, regs[0], 300<<10+5, 128<<10); err != nil {
		t.Fatal(err)
	}
	copy(la, pattern(1<<20, 9))
	moveAndCheck(t, a, win, la, 128<<10)
	if !bytes.Equal(rb[300<<10+5:428<<10+5], la[:128<<10]) {
		t.Fatal("window wrote to the wrong place")
	}
	// Past the window's end is refused, not written.
	r := newRecorder()
	over := tasksOf(r, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: win, TargetOffset: 64 << 10, Length: 64<<10 + 1})
	if k, err := a.t.Submit(over); k != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", k, err)
	}
	r.wait(t, 1)
	if !errors.Is(r.errs[over[0]], ErrNotRegistered) {
		t.Fatalf("write past the window: %v, want ErrNotRegistered", r.errs[over[0]])
	}
	for _, bad := range [][2]uint64{{0, 0}, {1 << 20, 1}, {1<<20 - 4, 5}} {
		if err := a.t.AddRemoteRange(9, regs[0], bad[0], bad[1]); !errors.Is(err, ErrNotRegistered) {
			t.Fatalf("AddRemoteRange(%d, %d) = %v", bad[0], bad[1], err)
		}
	}
	a.t.RemoveRemote(win)
	gone := tasksOf(r, xfer.Request{Op: xfer.OpRead, Local: segLocal, Target: win, Length: 1})
	if k, err := a.t.Submit(gone); k != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", k, err)
	}
	r.wait(t, 1)
	if !errors.Is(r.errs[gone[0]], ErrNotRegistered) {
		t.Fatalf("removed target: %v", r.errs[gone[0]])
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(rb)
}

func TestChannelPeerErrors(t *testing.T) {
	la, rb := pattern(64<<10, 1), make([]byte, 64<<10)
	a, b := exposedPair(t, la, rb)
	refused := errors.New("rdma is off here")
	cases := []struct {
		name string
		h    func(string, uint64, []byte) ([]byte, error)
		want error
	}{
		{"lookup fails", Acceptor(func(string, uint64) (*Transport, error) { return nil, refused }), refused},
		{"garbage answer", func(string, uint64, []byte) ([]byte, error) { return []byte("TCRQ"), nil }, ErrConnInfo},
		{"other queue pair", func(_ string, _ uint64, req []byte) ([]byte, error) {
			var ci ConnInfo
			if err := ci.UnmarshalBinary(req); err != nil {
				return nil, err
			}
			local, err := b.t.Accept(ci)
			if err != nil {
				return nil, err
			}
			local.QPIndex++
			return local.MarshalBinary()
		}, ErrConnInfo},
	}
	for _, c := range cases {
		ch := directChannel{"bravo/" + ExchangeKind: c.h}
		err := a.t.Connect(ChannelPeer{Ch: ch, ID: "bravo"})
		if !errors.Is(err, ErrConnect) || !errors.Is(err, c.want) {
			t.Errorf("%s: Connect = %v; want ErrConnect and %v", c.name, err, c.want)
		}
	}
	// The acceptor refuses garbage without calling lookup.
	called := false
	h := Acceptor(func(string, uint64) (*Transport, error) { called = true; return b.t, nil })
	if _, err := h("alpha", 1, []byte("not connection data")); !errors.Is(err, ErrConnInfo) || called {
		t.Fatalf("acceptor on garbage: %v (lookup called: %v)", err, called)
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(rb)
}

// tcpPair starts two tcp nodes, alpha and bravo, that know each other.
func tcpPair(t testing.TB) (alpha, bravo *tcp.Node) {
	t.Helper()
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte("cluster-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	var nodes []*tcp.Node
	for _, id := range []string{"alpha", "bravo"} {
		n, err := tcp.NewNode(tcp.Config{DaemonID: id, Listen: "127.0.0.1:0", ClusterKeyFile: key, ConnsPerPeer: 1,
			RequestTimeout: 10 * time.Second}, noExports{}, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	for i, n := range nodes {
		o := nodes[1-i]
		if err := n.Directory().Update(directory.Peer{ID: o.ID(), Addr: o.Addr()}); err != nil {
			t.Fatal(err)
		}
	}
	return nodes[0], nodes[1]
}

// noExports is a tcp.Exporter with nothing exported.
type noExports struct{}

func (noExports) Lookup(name string) (xfer.MemSegment, error) {
	return nil, fmt.Errorf("%q not exported", name)
}
func (noExports) Deliver(string, []byte) error { return errors.New("nothing exported") }

// TestChannelPeerOverTCP: the connection data travels over two real tcp
// nodes' peer channel; the verbs are fakes.
func TestChannelPeerOverTCP(t *testing.T) {
	alpha, bravo := tcpPair(t)
	la, rb := pattern(1<<20, 7), make([]byte, 1<<20)
	a, b := exposedPair(t, la, rb)
	var from string
	var epoch uint64
	if err := bravo.Handle(ExchangeKind, Acceptor(func(f string, e uint64) (*Transport, error) {
		from, epoch = f, e
		return b.t, nil
	})); err != nil {
		t.Fatal(err)
	}
	if err := a.t.Connect(ChannelPeer{Ch: alpha, ID: "bravo", Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if from != "alpha" || epoch != alpha.Epoch() {
		t.Fatalf("acceptor saw %s@%#x, want alpha@%#x", from, epoch, alpha.Epoch())
	}
	regs := a.t.PeerRegions()
	if len(regs) != 1 {
		t.Fatalf("learned %d regions", len(regs))
	}
	if err := a.t.AddRemote(segRemote, regs[0]); err != nil {
		t.Fatal(err)
	}
	moveAndCheck(t, a, segRemote, la, 256<<10)
	// Without a handler on the peer, Connect fails with the channel's error.
	if err := bravo.Handle(ExchangeKind, nil); err != nil {
		t.Fatal(err)
	}
	c := newFakeSide(t, Config{QPs: 1})
	defer c.t.Close()
	if err := c.t.Connect(ChannelPeer{Ch: alpha, ID: "bravo"}); !errors.Is(err, tcp.ErrNoHandler) {
		t.Fatalf("Connect to a peer without rdma: %v, want tcp.ErrNoHandler", err)
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(rb)
}
