package cluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// An in-memory cluster for tests of the store across hosts without
// sockets: daemons whose peer channel is a map of handlers called in the
// caller's goroutine, and whose mover copies between their pools.

var errUnreachable = errors.New("fake peer: unreachable")

// errBusy is a peer's refusal of an exchange it did not run, its
// handlers all taken (tcp.ErrPeerBusy).
var errBusy = errors.New("fake peer: busy, too many exchanges in progress")

// fakeNet is the daemons of one test.
type fakeNet struct {
	// mu guards nodes.
	mu    sync.Mutex
	nodes map[string]*fakeNode
	// cfgOf is each daemon's config, for another run of it (restart).
	cfgOf map[string]Config
	// gate, while open is nil, holds every read until it is closed.
	gateMu   sync.Mutex // guards gate, inflight, most and reads
	gate     chan struct{}
	inflight map[string]int
	most     map[string]int
	reads    map[string]int
	// kindMu guards kinds: the exchanges made, by kind.
	kindMu sync.Mutex
	kinds  map[string]uint64
	// cutMu guards cuts: pairs of daemons that cannot reach each other
	// (a partition between them; each reaches the others); and flying:
	// the exchanges being handled, by sender and receiver. cutGone is
	// signalled when one of those ends.
	cutMu   sync.Mutex
	cuts    map[[2]string]bool
	flying  map[[2]string]int
	cutGone *sync.Cond
	// lateMu guards late and lates: while late is set, every read fails
	// as one past its deadline whose transfer has yet to land (lates,
	// until landLate).
	lateMu sync.Mutex
	late   bool
	lates  []lateRead
	// sums: reads from these holders come back with their Sum taken, as
	// from a transport that took each span's crc32c as it landed; a true
	// value sums wrong (as if the bytes seen on the way were other than
	// those in the pool). Set before the reads.
	sums map[string]bool
	// quick: the daemons read by key in one exchange (quickNode), set
	// before they are built (newQuickNet). mute, guarded by kindMu:
	// holders that never answer such a read (it fails at its deadline).
	quick bool
	mute  map[string]bool
	// l2: the daemons whose store has an L2 (a file in memory, moved by
	// an xfertest transport whose reads can be held), set before they
	// are built (withL2).
	l2 map[string]*memL2
	// maxKeys: the most keys one call of each daemon's store takes, for
	// the daemons it names (withMaxKeysPerCall), set before they are
	// built; the store's default for the others.
	maxKeys map[string]int
	// older, guarded by kindMu: daemons that act on the wire as a release
	// without the messages with removal ages (olderWire); olderRefused
	// counts the messages such a daemon's decoders would have refused.
	older        map[string]bool
	olderRefused int
	// busy, guarded by kindMu: how many more exchanges each daemon
	// answers busy (-1: all of them), and busyKinds how many it did, by
	// kind (busyOf).
	busy      map[string]int
	busyKinds map[string]int
	// silent, guarded by cutMu: daemons whose exchanges wait, unanswered,
	// until released or their timeout (a stopped daemon, a link dropping
	// packets); helloWaiting counts the hellos waiting on them now.
	silent       map[string]chan struct{}
	helloWaiting int
	// slow, guarded by cutMu: exchanges of a kind sent by a daemon
	// ([2]string{from, kind}) wait until released or their timeout (a
	// daemon whose announcements are slow to arrive); slowWaiting counts
	// those waiting now.
	slow        map[[2]string]chan struct{}
	slowWaiting int
}

// gate puts one channel under keys in m (guarded by f.cutMu), which the
// returned release (which the test's end calls too) deletes and closes:
// what waits on it (waitGate) goes on then.
func gate[K comparable](f *fakeNet, t testing.TB, m map[K]chan struct{}, keys ...K) (release func()) {
	f.cutMu.Lock()
	defer f.cutMu.Unlock()
	ch := make(chan struct{})
	for _, k := range keys {
		m[k] = ch
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			f.cutMu.Lock()
			defer f.cutMu.Unlock()
			for _, k := range keys {
				delete(m, k)
			}
			close(ch)
		})
	}
	t.Cleanup(release)
	return release
}

// waitGate waits while ch (a gate's, nil for none) is open: until it is
// released (true) or timeout passes (false).
func waitGate(ch chan struct{}, timeout time.Duration) bool {
	if ch == nil {
		return true
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// silence makes exchanges with the daemons ids wait unanswered until the
// returned release (which the test's end calls too) or their timeout.
func (f *fakeNet) silence(t testing.TB, ids ...string) (release func()) {
	return gate(f, t, f.silent, ids...)
}

// holdKind makes the exchanges of kind that from sends wait until the
// returned release (which the test's end calls too) or their timeout.
func (f *fakeNet) holdKind(t testing.TB, from, kind string) (release func()) {
	return gate(f, t, f.slow, [2]string{from, kind})
}

// heldKinds is how many exchanges holdKind holds now.
func (f *fakeNet) heldKinds() int {
	f.cutMu.Lock()
	defer f.cutMu.Unlock()
	return f.slowWaiting
}

// waitSlow holds an exchange of kind from from while holdKind says so,
// until it is released (true) or timeout passes (false).
func (f *fakeNet) waitSlow(from, kind string, timeout time.Duration) bool {
	f.cutMu.Lock()
	ch := f.slow[[2]string{from, kind}]
	f.cutMu.Unlock()
	return f.waitCounted(ch, &f.slowWaiting, timeout)
}

// waitSilent holds an exchange of kind with peer while peer is silent,
// until it is released (true) or timeout passes (false).
func (f *fakeNet) waitSilent(peer, kind string, timeout time.Duration) bool {
	f.cutMu.Lock()
	ch := f.silent[peer]
	f.cutMu.Unlock()
	var n *int
	if kind == kindHello {
		n = &f.helloWaiting
	}
	return f.waitCounted(ch, n, timeout)
}

// waitCounted is waitGate with *n (guarded by f.cutMu; nil for none) one
// higher while it waits.
func (f *fakeNet) waitCounted(ch chan struct{}, n *int, timeout time.Duration) bool {
	if ch == nil || n == nil {
		return waitGate(ch, timeout)
	}
	f.cutMu.Lock()
	*n++
	f.cutMu.Unlock()
	defer func() {
		f.cutMu.Lock()
		*n--
		f.cutMu.Unlock()
	}()
	return waitGate(ch, timeout)
}

// olderWire makes daemon id act on the wire as a release without the
// messages with removal ages: it serves no kindAnnounceAges or
// kindDropAges, and sends neither (each is answered to it as not served,
// so it sends the older kind, as that release does); and its decoders
// refuse what that release's refused, a drop with ages and an
// announcement answer with them (counted in olderRefused).
func (f *fakeNet) olderWire(id string) {
	f.kindMu.Lock()
	defer f.kindMu.Unlock()
	f.older[id] = true
}

// olderRefuses reports whether an exchange of kind from daemon from to to,
// with request req and answer resp (nil before the handler ran), is one an
// older release on either side would refuse, counting it if so.
func (f *fakeNet) olderRefuses(from, to, kind string, req, resp []byte) error {
	f.kindMu.Lock()
	defer f.kindMu.Unlock()
	var err error
	switch {
	case (kind == kindAnnounceAges || kind == kindDropAges || kind == kindPull || kind == kindWalked) && (f.older[from] || f.older[to]):
		return fmt.Errorf("fake peer: no handler of %s (an older release): %w", kind, xfer.ErrNotSupported)
	case kind == kindDrop && f.older[to] && resp == nil:
		_, err = decodeKeys(req)
	case kind == kindAnnounce && f.older[from] && resp != nil:
		body, stale, uerr := unwrapAnswer(resp)
		if uerr != nil || stale != nil {
			return nil // taken as today's daemon takes it
		}
		d := newDec(body)
		d.u32()
		for n := d.count(maxMsgKeys); n > 0 && d.err == nil; n-- {
			d.u32()
		}
		err = d.end()
	}
	if err != nil {
		f.olderRefused++
		return fmt.Errorf("fake peer: %s refused by an older release's decoder: %w", kind, err)
	}
	return nil
}

// lateRead is a failed read whose transfer is still to land: its spans'
// bytes in the reader's pool, and the channel that says it has landed.
type lateRead struct {
	dst     []byte
	spans   []Span
	settled chan struct{}
}

// readLate makes every read from now on fail with its transfer still to
// land (on) or read again (off).
func (f *fakeNet) readLate(on bool) {
	f.lateMu.Lock()
	defer f.lateMu.Unlock()
	f.late = on
}

// landLate has the late reads' transfers land, as junk, in the blocks
// they were reading into, and says they have: what a READ that outlived
// its deadline does.
func (f *fakeNet) landLate(junk byte) int {
	f.lateMu.Lock()
	defer f.lateMu.Unlock()
	for _, l := range f.lates {
		for _, s := range l.spans {
			b := l.dst[s.Local : s.Local+s.Length]
			for i := range b {
				b[i] = junk
			}
		}
		close(l.settled)
	}
	n := len(f.lates)
	f.lates = nil
	return n
}

// partition cuts daemons a and b from each other (on) or heals the cut.
// A cut returns once no exchange between them is being handled: what one
// sent before the cut has arrived, and nothing arrives after it.
func (f *fakeNet) partition(a, b string, on bool) {
	f.cutMu.Lock()
	defer f.cutMu.Unlock()
	f.cuts[[2]string{a, b}], f.cuts[[2]string{b, a}] = on, on
	for on && f.flying[[2]string{a, b}]+f.flying[[2]string{b, a}] > 0 {
		f.cutGone.Wait()
	}
}

// enter starts the handling of an exchange from one daemon to another;
// false when a cut is between them. leave ends it.
func (f *fakeNet) enter(from, to string) bool {
	f.cutMu.Lock()
	defer f.cutMu.Unlock()
	if f.cuts[[2]string{from, to}] {
		return false
	}
	f.flying[[2]string{from, to}]++
	return true
}

func (f *fakeNet) leave(from, to string) {
	f.cutMu.Lock()
	defer f.cutMu.Unlock()
	f.flying[[2]string{from, to}]--
	f.cutGone.Broadcast()
}

// isCut reports whether a and b cannot reach each other.
func (f *fakeNet) isCut(a, b string) bool {
	f.cutMu.Lock()
	defer f.cutMu.Unlock()
	return f.cuts[[2]string{a, b}]
}

// fakeNode is one daemon.
type fakeNode struct {
	net   *fakeNet
	id    string
	epoch atomic.Uint64 // its run: restart takes it one higher
	pool  *shm.Pool
	st    *store.Store
	c     *Cluster
	ready atomic.Bool // its Cluster is built: it answers
	// readyCh is closed once ready: an exchange with a daemon still
	// being built waits for it (the daemons of a test start together).
	readyCh chan struct{}
	down    atomic.Bool // unreachable both ways
	// hmu guards h, hi and nested (the kinds registered with
	// HandleNested; the fake bounds no handlers, so this is all it does
	// apart).
	hmu    sync.RWMutex
	h      map[string]func(string, uint64, []byte) ([]byte, error)
	hi     map[string]func(string, uint64, []byte, func(resp, payload []byte)) error
	nested map[string]bool
	// dropped counts the DropStalled calls, by peer, and dropAt is when
	// the last one began (dmu).
	dmu     sync.Mutex
	dropped map[string]int
	dropAt  map[string]time.Time
}

// DropStalled implements StallDropper: the fake net has no connections
// to close, so it only counts, and notes when it was called (it returns
// once the clock has passed that).
func (n *fakeNode) DropStalled(peer, reason string) int {
	at := time.Now()
	n.dmu.Lock()
	if n.dropped == nil {
		n.dropped, n.dropAt = map[string]int{}, map[string]time.Time{}
	}
	n.dropped[peer]++
	n.dropAt[peer] = at
	n.dmu.Unlock()
	for !time.Now().After(at) {
	}
	return 1
}

// drops is how many times n was asked to drop its stalled connections to
// peer.
func (n *fakeNode) drops(peer string) int {
	n.dmu.Lock()
	defer n.dmu.Unlock()
	return n.dropped[peer]
}

// quickNode is a fakeNode that also reads by key in one exchange
// (KeyReader) and serves such reads (QuickPeers), in the caller's
// goroutine: the holder's handler runs, its answer's payload is copied
// into dst, and done runs, before ReadKey returns.
type quickNode struct{ *fakeNode }

var (
	_ KeyReader  = quickNode{}
	_ QuickPeers = quickNode{}
)

func (n quickNode) HandleInline(kind string, h func(string, uint64, []byte, func(resp, payload []byte)) error) error {
	n.hmu.Lock()
	defer n.hmu.Unlock()
	if h == nil {
		delete(n.hi, kind)
	} else {
		n.hi[kind] = h
	}
	return nil
}

func (n quickNode) ReadKey(holder string, epoch uint64, kind string, req, dst []byte, _ bool, deadline time.Time,
	done func(resp []byte, got int, err error)) bool {
	p := n.net.node(holder)
	if p == nil || p.down.Load() || n.down.Load() || n.net.isCut(n.id, holder) || epoch != 0 && epoch != p.epoch.Load() {
		return false
	}
	n.net.kindMu.Lock()
	n.net.kinds[kind]++
	mute := n.net.mute[holder]
	n.net.kindMu.Unlock()
	if mute {
		time.AfterFunc(time.Until(deadline), func() {
			done(nil, 0, fmt.Errorf("fake peer: %s never answered: %w", holder, xfer.ErrTimeout))
		})
		return true
	}
	p.hmu.RLock()
	h := p.hi[kind]
	p.hmu.RUnlock()
	if h == nil {
		return false
	}
	var resp []byte
	got, replied := 0, false
	err := h(n.id, n.epoch.Load(), slices.Clone(req), func(r, payload []byte) {
		resp, replied = slices.Clone(r), true
		got = copy(dst, payload)
	})
	if err == nil && !replied {
		err = errors.New("fake peer: the handler gave no answer")
	}
	done(resp, got, err)
	return true
}

var _ Peers = (*fakeNode)(nil)

func (n *fakeNode) ID() string    { return n.id }
func (n *fakeNode) Epoch() uint64 { return n.epoch.Load() }

func (n *fakeNode) Handle(kind string, h func(string, uint64, []byte) ([]byte, error)) error {
	n.hmu.Lock()
	defer n.hmu.Unlock()
	if h == nil {
		delete(n.h, kind)
	} else {
		n.h[kind] = h
	}
	return nil
}

func (n *fakeNode) HandleNested(kind string, h func(string, uint64, []byte) ([]byte, error)) error {
	n.hmu.Lock()
	if h == nil {
		delete(n.nested, kind)
	} else {
		n.nested[kind] = true
	}
	n.hmu.Unlock()
	return n.Handle(kind, h)
}

func (n *fakeNode) ExchangeAt(peer string, epoch uint64, kind string, req []byte, timeout time.Duration) ([]byte, error) {
	if !n.net.waitSilent(peer, kind, timeout) || !n.net.waitSlow(n.id, kind, timeout) {
		return nil, fmt.Errorf("%w: %s never answered: %w", errUnreachable, peer, xfer.ErrTimeout)
	}
	p := n.net.node(peer)
	if p != nil && !p.ready.Load() {
		select {
		case <-p.readyCh:
		case <-time.After(10 * time.Second):
		}
	}
	switch {
	case n.down.Load():
		return nil, fmt.Errorf("%w: %s is down", errUnreachable, n.id)
	case p == nil || !p.ready.Load() || p.down.Load():
		return nil, fmt.Errorf("%w: %s", errUnreachable, peer)
	case epoch != 0 && epoch != p.epoch.Load():
		return nil, fmt.Errorf("%w: %s runs another epoch", errUnreachable, peer)
	case !n.net.enter(n.id, peer):
		return nil, fmt.Errorf("%w: %s (cut)", errUnreachable, peer)
	}
	defer n.net.leave(n.id, peer)
	n.net.kindMu.Lock()
	if left := n.net.busy[peer]; left != 0 {
		if left > 0 {
			n.net.busy[peer] = left - 1
		}
		n.net.busyKinds[kind]++
		n.net.kindMu.Unlock()
		return nil, fmt.Errorf("%w: %s on %s", errBusy, kind, peer)
	}
	n.net.kinds[kind]++
	n.net.kindMu.Unlock()
	p.hmu.RLock()
	h := p.h[kind]
	p.hmu.RUnlock()
	if h == nil {
		// As tcp.ErrNoHandler: the asker can tell it from a failure.
		return nil, fmt.Errorf("fake peer: no handler of %s on %s: %w", kind, peer, xfer.ErrNotSupported)
	}
	if err := n.net.olderRefuses(n.id, peer, kind, req, nil); err != nil {
		return nil, err
	}
	resp, err := h(n.id, n.epoch.Load(), slices.Clone(req))
	if err != nil {
		return nil, fmt.Errorf("fake peer: %s on %s: %s", kind, peer, err) // the text only, as over the wire
	}
	if err := n.net.olderRefuses(n.id, peer, kind, req, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func (n *fakeNode) EpochOf(id string) uint64 {
	if p := n.net.node(id); p != nil && p.ready.Load() {
		return p.epoch.Load()
	}
	return 0
}

func (n *fakeNode) Unreachable(err error) bool { return errors.Is(err, errUnreachable) }

func (n *fakeNode) Busy(err error) bool { return errors.Is(err, errBusy) }

// busyFor makes daemon id answer its next n exchanges busy (-1: every one
// until busyFor(id, 0)).
func (f *fakeNet) busyFor(id string, n int) {
	f.kindMu.Lock()
	defer f.kindMu.Unlock()
	f.busy[id] = n
}

// Read implements Mover: it copies from the holder's pool into n's,
// after the net's gate (or fails with its transfer still to land, while
// the net reads late).
func (n *fakeNode) Read(holder string, epoch uint64, spans []Span, deadline time.Time) (<-chan struct{}, error) {
	p := n.net.node(holder)
	if p == nil || p.down.Load() || n.down.Load() || n.net.isCut(n.id, holder) || epoch != 0 && epoch != p.epoch.Load() {
		return nil, fmt.Errorf("%w: reading from %s", errUnreachable, holder)
	}
	f := n.net
	f.lateMu.Lock()
	if f.late {
		l := lateRead{dst: n.pool.Bytes(), spans: slices.Clone(spans), settled: make(chan struct{})}
		f.lates = append(f.lates, l)
		f.lateMu.Unlock()
		return l.settled, fmt.Errorf("fake mover: reading from %s: %w", holder, xfer.ErrTimeout)
	}
	f.lateMu.Unlock()
	f.gateMu.Lock()
	f.inflight[holder]++
	f.reads[holder]++
	f.most[holder] = max(f.most[holder], f.inflight[holder])
	gate := f.gate
	f.gateMu.Unlock()
	defer func() {
		f.gateMu.Lock()
		f.inflight[holder]--
		f.gateMu.Unlock()
	}()
	if gate != nil {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-gate:
		case <-t.C:
			return nil, fmt.Errorf("fake mover: the gate stayed shut past the deadline")
		}
	}
	if n.down.Load() {
		// The reader died while its read waited: a dead daemon's read
		// never lands.
		return nil, fmt.Errorf("%w: %s died reading", errUnreachable, n.id)
	}
	src, dst := p.pool.Bytes(), n.pool.Bytes()
	for i, s := range spans {
		copy(dst[s.Local:s.Local+s.Length], src[s.Remote:s.Remote+s.Length])
		if wrong, ok := f.sums[holder]; ok {
			spans[i].Sum = xfer.Sum{CRC: store.CRC(dst[s.Local : s.Local+s.Length]), Taken: true}
			if wrong {
				spans[i].Sum.CRC ^= 1
			}
		}
	}
	return nil, nil
}

// holdReads makes every read between daemons wait until releaseReads.
func (f *fakeNet) holdReads() {
	f.gateMu.Lock()
	defer f.gateMu.Unlock()
	f.gate = make(chan struct{})
}

// releaseReads lets the held reads, and every one after them, go on.
func (f *fakeNet) releaseReads() {
	f.gateMu.Lock()
	defer f.gateMu.Unlock()
	close(f.gate)
	f.gate = nil
}

func (f *fakeNet) node(id string) *fakeNode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[id]
}

// inflightNow is the reads in flight in all.
func (f *fakeNet) inflightNow() int {
	f.gateMu.Lock()
	defer f.gateMu.Unlock()
	n := 0
	for _, v := range f.inflight {
		n += v
	}
	return n
}

// newNet builds daemons ids (one after the other, each greeting those
// before it) with cfg's settings, and waits until every one sees them
// all.
func newNet(t testing.TB, ids []string, cfg Config) *fakeNet {
	t.Helper()
	return newNetWith(t, ids, cfg, nil)
}

// newQuickNet is newNet of daemons that read by key in one exchange
// (quickNode).
func newQuickNet(t testing.TB, ids []string, cfg Config) *fakeNet {
	t.Helper()
	return newNetWith(t, ids, cfg, nil, func(f *fakeNet) { f.quick = true })
}

// newNetWith is newNet with a last say on each daemon's config, and on
// the net before its daemons are built (opts).
func newNetWith(t testing.TB, ids []string, cfg Config, mut func(id string, c *Config), opts ...func(*fakeNet)) *fakeNet {
	t.Helper()
	f := &fakeNet{nodes: map[string]*fakeNode{}, cfgOf: map[string]Config{}, kinds: map[string]uint64{}, inflight: map[string]int{}, most: map[string]int{}, reads: map[string]int{},
		cuts: map[[2]string]bool{}, flying: map[[2]string]int{}, mute: map[string]bool{}, older: map[string]bool{},
		silent: map[string]chan struct{}{}, slow: map[[2]string]chan struct{}{}, busy: map[string]int{}, busyKinds: map[string]int{}}
	for _, o := range opts {
		o(f)
	}
	f.cutGone = sync.NewCond(&f.cutMu)
	for _, id := range ids {
		f.nodes[id] = &fakeNode{net: f, id: id, readyCh: make(chan struct{}), h: map[string]func(string, uint64, []byte) ([]byte, error){},
			nested: map[string]bool{},
			hi:     map[string]func(string, uint64, []byte, func(resp, payload []byte)) error{}}
	}
	t.Cleanup(func() {
		for _, n := range f.nodes {
			if n.c != nil {
				n.st.SetRemote(nil)
				n.c.Close()
			}
		}
		for _, n := range f.nodes {
			if n.c != nil {
				n.st.Close()
				n.pool.Close()
			}
		}
	})
	for i, id := range ids {
		pool, err := shm.NewPool(shm.PoolConfig{ID: 1, Size: 1 << 20, Hugepages: shm.HugepagesOff, MinBlock: 4096, MaxBlock: 64 << 10}, nil)
		if err != nil {
			t.Fatal(err)
		}
		scfg := store.Config{L1Capacity: 1 << 20, MaxKeysPerCall: f.maxKeys[id]}
		if f.maxKeys[id] != 0 {
			// Room for a message's keys in one session's smallest blocks.
			scfg.MaxSessionReserved = maxMsgKeys * 4096
		}
		var l2 *store.L2
		if m := f.l2[id]; m != nil {
			// Over the high watermark, every clean value leaves the pool.
			l2, scfg.LowWatermark = m.l2(), 0.01
		}
		st, err := store.New(scfg, pool, l2)
		if err != nil {
			pool.Close()
			t.Fatal(err)
		}
		n := f.node(id)
		n.epoch.Store(uint64(1000 + i))
		n.pool, n.st = pool, st
		c := cfg
		c.Members = ids
		c.Pool = pool.Bytes()
		if mut != nil {
			mut(id, &c)
		}
		f.cfgOf[id] = c
		cl, err := f.start(n)
		if err != nil {
			st.Close()
			pool.Close()
			t.Fatal(err)
		}
		n.c = cl
		st.SetRemote(cl)
		n.ready.Store(true)
		close(n.readyCh)
	}
	want := slices.Sorted(slices.Values(ids))
	for _, id := range ids {
		n := f.nodes[id]
		// Its start-up hellos have ended: none lands later, in the middle
		// of what the test does (a member taken for down, or up).
		select {
		case <-n.c.greeted:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s's start-up greeting not ended within 20s", id)
		}
		testutil.Eventually(t, 20*time.Second, func() bool { return slices.Equal(n.c.Members(), want) },
			"%s seeing every member (it sees %d)", id, testutil.Lazy(func() int { return len(n.c.Members()) }))
	}
	if len(f.older) == 0 {
		// The start-up pulls and the walks they ask for have ended:
		// nothing of the start-up lands in what the test does. (A member
		// of an older release never says its walk is done.)
		f.quiet(t)
	}
	return f
}

// quiet waits until the daemons' start-up work has ended: every home has
// each member's word for its shards, nothing is queued to announce or
// re-announce, and no exchange is being handled. With an hour between
// probe rounds, nothing is sent after that unless the test asks for it.
func (f *fakeNet) quiet(t testing.TB) {
	t.Helper()
	idle := func() bool {
		for _, n := range f.nodes {
			n.c.mu.Lock()
			busy := len(n.c.pending) > 0 || n.c.sending || len(n.c.reqs) > 0
			n.c.mu.Unlock()
			if busy || n.c.Stats().Rebuilding != 0 {
				return false
			}
		}
		f.cutMu.Lock()
		defer f.cutMu.Unlock()
		for _, v := range f.flying {
			if v > 0 {
				return false
			}
		}
		return true
	}
	testutil.Eventually(t, 20*time.Second, idle, "the daemons' start-up work ended")
}

// start makes n's Cluster of its config, at its epoch.
func (f *fakeNet) start(n *fakeNode) (*Cluster, error) {
	var peers Peers = n
	var mover Mover = n
	if f.quick {
		peers, mover = quickNode{n}, quickNode{n}
	}
	return New(f.cfgOf[n.id], n.st, peers, mover)
}

// restart stops daemon id's Cluster and starts another run of it (its
// epoch one higher) over the same store, as a daemon that restarted with
// its values on L2; it returns once the new run's start-up greeting ended.
func (f *fakeNet) restart(t testing.TB, id string) {
	t.Helper()
	n := f.node(id)
	n.st.SetRemote(nil)
	n.c.Close()
	n.epoch.Add(1)
	cl, err := f.start(n)
	if err != nil {
		t.Fatal(err)
	}
	n.c = cl
	n.st.SetRemote(cl)
	select {
	case <-cl.greeted:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s's start-up greeting not ended within 20s after a restart", id)
	}
}

// value is key's test value of size bytes.
func value(key string, size int) []byte {
	rng := rand.New(rand.NewPCG(uint64(len(key)), uint64(size)))
	for _, c := range key {
		rng = rand.New(rand.NewPCG(rng.Uint64()^uint64(c), 7))
	}
	v := make([]byte, size)
	for i := range v {
		v[i] = byte(rng.Uint32())
	}
	return v
}

// put stores key with v on n (no durable).
func (n *fakeNode) put(t testing.TB, key string, v []byte) {
	t.Helper()
	ss := n.st.NewSession()
	defer ss.Close()
	codes := make([]store.Code, 1)
	if _, err := ss.Put([][]byte{[]byte(key)}, [][]byte{v}, false, codes, nil, nil, 0); err != nil || codes[0] != store.OK {
		t.Fatalf("put %s on %s: %v, %v", key, n.id, err, codes[0])
	}
}

// here is key's code in n's own store (no other daemon asked).
func (n *fakeNode) here(t testing.TB, key string) store.Code {
	t.Helper()
	ss := n.st.NewSession()
	defer ss.Close()
	codes := make([]store.Code, 1)
	if err := ss.GetHere([][]byte{[]byte(key)}, make([]store.Location, 1), codes, nil); err != nil {
		t.Fatal(err)
	}
	return codes[0]
}

// read reads key on n (fetching it from another daemon when it misses).
func (n *fakeNode) read(key string, size int) ([]byte, error) {
	dst := make([]byte, size)
	lens := make([]uint64, 1)
	codes := make([]store.Code, 1)
	errs := make([]error, 1)
	if _, err := n.st.Read([][]byte{[]byte(key)}, [][]byte{dst}, lens, codes, errs, nil, 0); err != nil {
		return nil, err
	}
	if codes[0] != store.OK {
		return nil, fmt.Errorf("code %v: %w", codes[0], errs[0])
	}
	return dst[:lens[0]], nil
}

// holders is the ids of key's holders as its home knows them.
func (f *fakeNet) holders(key string) []string {
	for _, n := range f.nodes {
		_, hs, err := n.c.Locate([]byte(key))
		if err != nil {
			return nil
		}
		ids := make([]string, len(hs))
		for i, h := range hs {
			ids[i] = h.ID
		}
		slices.Sort(ids)
		return ids
	}
	return nil
}

// memL2 is a daemon's L2 in a test: a file in memory, moved by an
// xfertest transport that holds its reads while holdReads is set (a
// promotion in flight) until release.
type memL2 struct {
	file      *xfertest.Segment
	tr        *xfertest.Transport
	holdReads atomic.Bool
}

// withL2 gives the daemons ids a store with an L2 (memL2), whose L1
// eviction, once the pool is over its high watermark, takes every value
// written back.
func withL2(ids ...string) func(*fakeNet) {
	return func(f *fakeNet) {
		f.l2 = map[string]*memL2{}
		for _, id := range ids {
			m := &memL2{file: xfertest.SegmentOf(900, xfer.KindFile, make([]byte, 16<<20))}
			m.tr = xfertest.New(xfertest.Config{Name: "memL2", Inline: true, Move: m.move,
				Hold: func(t *xfer.Task) bool { return t.Req.Op == xfer.OpRead && m.holdReads.Load() }})
			f.l2[id] = m
		}
	}
}

// withMaxKeysPerCall gives the daemons ids a store that takes at most n
// keys per call, and whose sessions may reserve a message's worth of keys
// (maxMsgKeys of the pool's smallest blocks, more than its default).
func withMaxKeysPerCall(n int, ids ...string) func(*fakeNet) {
	return func(f *fakeNet) {
		f.maxKeys = map[string]int{}
		for _, id := range ids {
			f.maxKeys[id] = n
		}
	}
}

func (m *memL2) l2() *store.L2 {
	return &store.L2{Transport: m.tr, File: m.file, StagingID: 901, RegionSize: 1 << 20}
}

// move copies a task's bytes between its memory and the file.
func (m *memL2) move(t *xfer.Task) (uint64, error) {
	q := t.Req
	mem, ok := t.Local.(xfer.MemSegment)
	if !ok || t.Target != xfer.Segment(m.file) {
		return 0, fmt.Errorf("%w: memL2: bad segments", xfer.ErrInvalid)
	}
	b, file := mem.Bytes(), m.file.Bytes()
	if q.TargetOffset+q.Length > uint64(len(file)) || q.LocalOffset+q.Length > uint64(len(b)) {
		return 0, fmt.Errorf("%w: memL2: out of bounds %+v", xfer.ErrInvalid, q)
	}
	if q.Op == xfer.OpWrite {
		copy(file[q.TargetOffset:q.TargetOffset+q.Length], b[q.LocalOffset:q.LocalOffset+q.Length])
	} else {
		copy(b[q.LocalOffset:q.LocalOffset+q.Length], file[q.TargetOffset:q.TargetOffset+q.Length])
	}
	return q.Length, nil
}

// busyOf is how many exchanges of the kinds named (of every kind, when
// none is) were answered busy: a test counts those of the call it makes,
// not of the exchanges the daemons make in the background meanwhile (a
// pull, a walk's word).
func (f *fakeNet) busyOf(kinds ...string) int {
	f.kindMu.Lock()
	defer f.kindMu.Unlock()
	n := 0
	for k, v := range f.busyKinds {
		if len(kinds) == 0 || slices.Contains(kinds, k) {
			n += v
		}
	}
	return n
}
