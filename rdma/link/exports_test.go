package link

import (
	"bytes"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/rdma/rdmatest"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestFabricStalledPeerHoldsUpOneRevocation: a peer that resolved a
// client's exports and then takes the owner's revocations without
// answering (d2 here, until the test lets it go) costs the owner's
// unexports one wait (revokeWait), not one per export: a client that
// unexports many (its buffer goes, its connection closes) must not wait
// that long for each.
func TestFabricStalledPeerHoldsUpOneRevocation(t *testing.T) {
	p := startPair(t, fabric())
	const exports = 3
	var xs []*peer.Export
	for i := range exports {
		name := string(rune('a' + i))
		x, err := p.d1.exports.Export(name, "", p.d1.pool, uint64(2+i)*block, block, wire.RightRead)
		if err != nil {
			t.Fatal(err)
		}
		p.d2.open(t, "d1/"+name, wire.RightRead, wire.TransportRDMA) // resolves it over rdma
		xs = append(xs, x)
	}
	var asked atomic.Int32
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	if err := p.d2.p.node.Handle(revokeTenantExchange, func(string, uint64, []byte) ([]byte, error) {
		asked.Add(1)
		<-release
		return nil, errors.New("d2 stalled")
	}); err != nil {
		t.Fatal(err)
	}
	for _, x := range xs {
		x.End(0)
	}
	if !strings.Contains(p.d1.log.String(), "peer did not confirm dropping an export's rdma keys") {
		t.Fatalf("d1 did not wait for d2 to confirm the first revocation\n%s", p.d1.log.String())
	}
	if n := asked.Load(); n > 1 {
		t.Fatalf("d1 waited on the stalled d2 for %d revocations of %d, want the first only\n%s", n, exports, p.d1.log.String())
	}
}

// slowRegistration makes the registrations of mem (by its first byte) on
// dev wait until release (the test's end releases them too), and counts
// them and their deregistrations; released gets every region dev
// deregisters.
type slowRegistration struct {
	entered      chan struct{} // a registration of mem began
	released     chan *rdma.Region
	regs, deregs atomic.Int32
	gate         chan struct{}
	once         sync.Once
	addr         uint64 // mem's
}

func slowlyRegister(t *testing.T, dev *rdmatest.Device, mem []byte) *slowRegistration {
	t.Helper()
	s := &slowRegistration{entered: make(chan struct{}, 1), released: make(chan *rdma.Region, 64), gate: make(chan struct{}),
		addr: addrOf(mem)}
	t.Cleanup(s.release)
	dev.OnRegister(func(m []byte, _ rdma.Access) {
		if len(m) == 0 || &m[0] != &mem[0] {
			return
		}
		s.regs.Add(1)
		select {
		case s.entered <- struct{}{}:
		default:
		}
		<-s.gate
	})
	dev.OnDeregister(func(r *rdma.Region) {
		if r.Addr() == s.addr && r.Size() == uint64(len(mem)) {
			s.deregs.Add(1)
		}
		select {
		case s.released <- r:
		default:
		}
	})
	return s
}

func (s *slowRegistration) release() { s.once.Do(func() { close(s.gate) }) }

// wait waits for c, failing the test after 10 s with what.
func wait[T any](t *testing.T, c <-chan T, what string, args ...any) T {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case v := <-c:
		return v
	case <-timer.C:
		t.Fatalf("not within 10s: "+what, args...)
	}
	var zero T
	return zero
}

// within runs f on a goroutine of its own and returns its error, failing
// the test when f has not returned within 10 s.
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	return wait(t, done, "%s", what)
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// exportAt exports block i of d1's pool as name, for reading.
func (p *pair) exportAt(t *testing.T, name string, i uint64) *peer.Export {
	t.Helper()
	x, err := p.d1.exports.Export(name, "", p.d1.pool, i*block, block, wire.RightRead)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

type exchanged struct {
	resp []byte
	err  error
}

// askRegion is d2 asking d1 for the registration of its export name, as a
// daemon before tenants does (by name: no link needed).
func (p *pair) askRegion(name string, into chan<- exchanged) {
	resp, err := p.d2.p.node.Exchange("d1", segmentExchange, []byte(name), 0)
	into <- exchanged{resp, err}
}

// TestFabricSlowExportRegistrationHoldsNothingElse: registering an export
// takes seconds for GiBs (ibv_reg_mr pins and maps every page), and while
// one registers (d1's registration of "big" waits here until the test lets
// it go) the owner's other rdma work goes on: another export is resolved
// and registered, a registered one ends and its keys are revoked, the
// counters answer, and a resolved segment moves by rdma. A second peer
// request for the export being registered waits for that registration
// rather than making another, and gets the same keys.
func TestFabricSlowExportRegistrationHoldsNothingElse(t *testing.T) {
	devs := fabric()
	p := startPair(t, devs)
	other := p.exportAt(t, "other", 2)
	p.exportAt(t, "big", 3)
	p.exportAt(t, "third", 4)
	w := xfer.Request{Op: xfer.OpWrite, Local: poolID, LocalOffset: p.src, Target: p.kv, Length: 64 << 10}
	p.d2.untilRDMA(t, p.kvRemote, w)
	p.d2.open(t, "d1/other", wire.RightRead, wire.TransportRDMA)

	slow := slowlyRegister(t, devs.fabricDevice("d1"), p.expMem(3*block, block))
	asked := make(chan exchanged, 2)
	go p.askRegion("big", asked)
	wait(t, slow.entered, "d1 registering big for d2")
	go p.askRegion("big", asked)

	var third *tcp.Remote
	if err := within(t, "resolving d1/third over rdma while big registers", func() (err error) {
		third, err = p.d2.p.OpenRemote("d1", tcp.Access{Name: "third"}, wire.RightRead, wire.TransportRDMA)
		return err
	}); err != nil {
		t.Fatalf("d1/third over rdma while big registers: %v\n%s", err, p.d1.log.String())
	}
	defer third.Close()
	if err := within(t, "ending d1's registered export other while big registers", func() error {
		if !other.End(time.Second) {
			return errors.New("peer requests held its range")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if c := strings.Count(p.d1.log.String(), "export's rdma registration revoked"); c != 1 {
		t.Fatalf("other's registration revoked %d times, want once:\n%s", c, p.d1.log.String())
	}
	_ = within(t, "d1's counters while big registers", func() error { p.d1.p.Counters(nil); return nil })
	before := p.d2.tcpBytes()
	if err := p.d2.do(t, w); err != nil {
		t.Fatalf("WRITE to d1/kv while big registers: %v", err)
	}
	if moved := p.d2.tcpBytes() - before; moved != 0 {
		t.Fatalf("a WRITE to d1/kv moved %d bytes over tcp while big registered", moved)
	}

	slow.release()
	var regions []rdma.RemoteRegion
	for range 2 {
		a := wait(t, asked, "d2's request for big's registration")
		if a.err != nil {
			t.Fatalf("big's registration: %v\n%s", a.err, p.d1.log.String())
		}
		var r rdma.RemoteRegion
		if err := r.UnmarshalBinary(a.resp); err != nil {
			t.Fatal(err)
		}
		regions = append(regions, r)
	}
	if !slices.Equal(regions[0].RKeys, regions[1].RKeys) || regions[0].Addr != slow.addr || slow.regs.Load() != 1 {
		t.Fatalf("two requests for big while it registered: %+v, registered %d times; want one registration for both",
			regions, slow.regs.Load())
	}
}

// TestFabricCloseDuringExportRegistration: links that close while an
// export registers (d1's of "big" waits here) release the other exports'
// registrations without waiting for it, then wait for it and release it,
// once; the peer that asked gets no keys, and d1's device has no region
// left when it closes (startSide's cleanup checks that).
func TestFabricCloseDuringExportRegistration(t *testing.T) {
	devs := fabric()
	p := startPair(t, devs)
	p.exportAt(t, "big", 3)
	if _, err := p.d2.p.node.Exchange("d1", segmentExchange, []byte("kv"), 0); err != nil {
		t.Fatal(err)
	}
	slow := slowlyRegister(t, devs.fabricDevice("d1"), p.expMem(3*block, block))
	asked := make(chan exchanged, 1)
	go p.askRegion("big", asked)
	wait(t, slow.entered, "d1 registering big for d2")

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		p.d1.stop()
	}()
	kv := addrOf(p.expMem(0, block))
	for r := (*rdma.Region)(nil); r == nil || r.Addr() != kv || r.Size() != block; { // not the pool, at the same address
		r = wait(t, slow.released, "d1's Close releasing kv's registration while big registers")
	}
	slow.release()
	wait(t, stopped, "d1's Close once big's registration ended")
	if a := wait(t, asked, "d2's request for big's registration"); a.err == nil {
		t.Fatal("d2 got the keys of big, registered while d1 closed")
	}
	if n, m := slow.regs.Load(), slow.deregs.Load(); n != 1 || m != 1 {
		t.Fatalf("big registered %d times and deregistered %d, want once each", n, m)
	}
	if strings.Contains(p.d1.log.String(), "name=big") {
		t.Fatalf("d1 published big's registration while it closed:\n%s", p.d1.log.String())
	}
}

// TestFabricUnexportDuringRegistration: an export that ends while it
// registers (d1's "big" waits here) gets no keys out: the registration is
// released once it ends, and the peer that asked is told it is gone.
func TestFabricUnexportDuringRegistration(t *testing.T) {
	devs := fabric()
	p := startPair(t, devs)
	big := p.exportAt(t, "big", 3)
	dev := devs.fabricDevice("d1")
	regions, _ := dev.Live()
	slow := slowlyRegister(t, dev, p.expMem(3*block, block))
	asked := make(chan exchanged, 1)
	go p.askRegion("big", asked)
	wait(t, slow.entered, "d1 registering big for d2")
	big.End(0) // does not wait for the registration's reference
	slow.release()
	if a := wait(t, asked, "d2's request for big's registration"); a.err == nil || !strings.Contains(a.err.Error(), "being unexported") {
		t.Fatalf("d2's request for big, unexported while it registered: %v", a.err)
	}
	if n, m := slow.regs.Load(), slow.deregs.Load(); n != 1 || m != 1 {
		t.Fatalf("big registered %d times and deregistered %d, want once each", n, m)
	}
	if now, _ := dev.Live(); now != regions {
		t.Fatalf("d1's device holds %d regions, %d before big's registration", now, regions)
	}
	if c := p.d1.counter(t, "rdma.exports_registered"); c != 0 {
		t.Fatalf("rdma.exports_registered %d after big ended", c)
	}
}

// TestFabricCloseDuringRevocation: an export's end asks the peers that
// hold its keys to drop them before it deregisters it (d2 takes the
// request and does not answer until the test lets it go); links that
// close meanwhile release that registration themselves, so that the
// device closes with no region left instead of failing as busy with the
// deregistration after it, and the end returns once it is released.
func TestFabricCloseDuringRevocation(t *testing.T) {
	devs := fabric()
	p := startPair(t, devs)
	x := p.exportAt(t, "x", 2)
	p.d2.open(t, "d1/x", wire.RightRead, wire.TransportRDMA) // resolves it over rdma
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	if err := p.d2.p.node.Handle(revokeTenantExchange, func(string, uint64, []byte) ([]byte, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return nil, errors.New("d2 stalled")
	}); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		x.End(0)
	}()
	wait(t, entered, "d1 asking d2 to drop x's keys")

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		p.d1.stop() // its cleanup checks that no region is left on the device
	}()
	wait(t, stopped, "d1's Close while x's end waits for d2")
	wait(t, ended, "x's end once d1 closed")
	if strings.Contains(p.d1.log.String(), "closing the rdma device") {
		t.Fatalf("d1's device did not close cleanly:\n%s", p.d1.log.String())
	}
}

// TestFabricCloseWaitsForAnUnexportsDeregistration: links that close
// while an export's end deregisters its registration (held here until the
// test lets it go) wait for it, and the device then closes with no region
// left.
func TestFabricCloseWaitsForAnUnexportsDeregistration(t *testing.T) {
	devs := fabric()
	p := startPair(t, devs)
	x := p.exportAt(t, "x", 2)
	p.d2.open(t, "d1/x", wire.RightRead, wire.TransportRDMA) // resolves it over rdma
	dev := devs.fabricDevice("d1")
	entered, gate := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	addr := addrOf(p.expMem(2*block, block))
	var first sync.Once
	dev.OnDeregister(func(r *rdma.Region) {
		if r.Addr() == addr && r.Size() == block { // not the pool, at the same address
			first.Do(func() {
				entered <- struct{}{}
				<-gate
			})
		}
	})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		x.End(0)
	}()
	wait(t, entered, "x's end deregistering its registration")

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		p.d1.stop() // its cleanup checks that no region is left on the device
	}()
	p.d1.log.waitFor(t, "closing waits for deregistrations in progress", 10*time.Second)
	release()
	wait(t, ended, "x's end")
	wait(t, stopped, "d1's Close once x's deregistration ended")
	if strings.Contains(p.d1.log.String(), "closing the rdma device") {
		t.Fatalf("d1's device did not close cleanly:\n%s", p.d1.log.String())
	}
}

// watchAsks wraps d1's handlers of the requests for an export's
// registration: the returned channel gets a token each time one begins
// to serve a request for name, holding one of d1's exchange handlers.
func (p *pair) watchAsks(t *testing.T, name string) <-chan struct{} {
	t.Helper()
	in := make(chan struct{}, 256)
	node, links := p.d1.p.node, p.d1.p.rdma
	signal := func(n string) {
		if n == name {
			in <- struct{}{}
		}
	}
	if err := node.Handle(segmentExchange, func(from string, epoch uint64, req []byte) ([]byte, error) {
		signal(string(req))
		return links.serveSegmentByName(from, epoch, req)
	}); err != nil {
		t.Fatal(err)
	}
	if err := node.Handle(segmentTokenExchange, func(from string, epoch uint64, req []byte) ([]byte, error) {
		if a, err := node.Verify(req, 0); err == nil {
			signal(a.Name)
		}
		return links.serveSegment(from, epoch, req)
	}); err != nil {
		t.Fatal(err)
	}
	return in
}

// maxNodeHandlers is how many exchange handlers a tcp node runs at once.
const maxNodeHandlers = tcp.MaxExchangeHandlers

// holdHandlers takes every exchange handler of d1's node with exchanges
// from d2 of a kind of the test's, held until the returned release, which
// then waits for them to end (the test's end releases them too).
func (p *pair) holdHandlers(t *testing.T) (release func()) {
	t.Helper()
	entered, gate := make(chan struct{}, maxNodeHandlers), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(gate) }) })
	if err := p.d1.p.node.Handle("test.hold", func(string, uint64, []byte) ([]byte, error) {
		entered <- struct{}{}
		<-gate
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, maxNodeHandlers)
	for range maxNodeHandlers {
		go func() {
			// A hold refused busy met a handler of the pair's own set-up
			// still running; it is asked again until it is served.
			for {
				_, err := p.d2.p.node.Exchange("d1", "test.hold", nil, 0)
				if !errors.Is(err, tcp.ErrPeerBusy) {
					held <- err
					return
				}
				runtime.Gosched()
			}
		}()
	}
	for i := range maxNodeHandlers {
		wait(t, entered, "d1 holding exchange %d of %d", i+1, maxNodeHandlers)
	}
	return func() {
		t.Helper()
		once.Do(func() { close(gate) })
		for range maxNodeHandlers {
			if err := wait(t, held, "d1's held exchanges"); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestFabricRequestsForARegisteringExportLeaveHandlersFree: while d1
// registers "big" (held here until the test lets it go), as many requests
// for it as d1's node has exchange handlers do not take them all: beyond
// the one registering it and maxExportWaiters waiting for it, they are
// answered busy at once, so that d1 still sets a link up and resolves
// another export over rdma. A daemon that asks for big and is answered
// busy asks again, and gets the keys once the registration ends.
func TestFabricRequestsForARegisteringExportLeaveHandlersFree(t *testing.T) {
	devs := fabric()
	p := startPair(t, devs)
	p.exportAt(t, "big", 3)
	p.exportAt(t, "third", 4)
	_, bigRemote := p.d2.open(t, "d1/big", wire.RightRead, wire.TransportAuto)
	asks := p.watchAsks(t, "big")
	slow := slowlyRegister(t, devs.fabricDevice("d1"), p.expMem(3*block, block))

	asked := make(chan exchanged, maxNodeHandlers)
	for range maxNodeHandlers {
		go p.askRegion("big", asked)
	}
	for i := range maxNodeHandlers {
		wait(t, asks, "d1 serving request %d of %d for big", i+1, maxNodeHandlers)
	}
	wait(t, slow.entered, "d1 registering big")
	for i := range maxNodeHandlers - 1 - maxExportWaiters {
		a := wait(t, asked, "request %d of those beyond the bound for big answered at once, while big registers", i+1)
		if a.err != nil || !bytes.Equal(a.resp, busyAnswer) {
			t.Fatalf("a request for big beyond the bound: %q, %v; want busyAnswer", a.resp, a.err)
		}
	}
	if err := within(t, "d2's rdma link to d1 and d1/third over rdma while big registers", func() error {
		r, err := p.d2.p.OpenRemote("d1", tcp.Access{Name: "third"}, wire.RightRead, wire.TransportRDMA)
		if err == nil {
			r.Close()
		}
		return err
	}); err != nil {
		t.Fatalf("d1/third over rdma while big registers: %v\n%s", err, p.d1.log.String())
	}

	// d2's worker asks for big: answered busy, it asks again.
	prepared := make(chan error, 1)
	go func() { prepared <- p.d2.prepare(bigRemote) }()
	wait(t, asks, "d2's worker asking for big")
	wait(t, asks, "d2's worker asking for big again")
	slow.release()
	for range 1 + maxExportWaiters {
		if a := wait(t, asked, "a request for big that waited for its registration"); a.err != nil {
			t.Fatalf("a request for big that waited: %v", a.err)
		}
	}
	if err := wait(t, prepared, "d2's worker resolving big"); err != nil {
		t.Fatalf("d2 resolving big, answered busy while it registered: %v\n%s", err, p.d2.log.String())
	}
	if k := rdma.KeysOf(bigRemote); k == nil {
		t.Fatal("d2 resolved big but its segment carries no keys")
	}
	if n := slow.regs.Load(); n != 1 {
		t.Fatalf("big registered %d times, want once", n)
	}
	// Those beyond the bound, and the worker's first request at least.
	if n, want := p.d1.counter(t, "rdma.exports_busy"), uint64(maxNodeHandlers-maxExportWaiters); n < want {
		t.Fatalf("d1 counts %d busy answers, want at least %d", n, want)
	}
	if n := p.d2.counter(t, "rdma.owner_busy"); n == 0 {
		t.Fatal("d2 counts no busy answer")
	}
}

// TestFabricOwnerBusyPastTheDeadline: a pin whose deadline passes while
// the owner answers busy (it registers the export, for a request that
// waits here until the test lets it go, with maxExportWaiters more
// waiting) fails BUSY, saying so, rather than waiting on.
func TestFabricOwnerBusyPastTheDeadline(t *testing.T) {
	devs := fabric()
	p := startPair(t, devs)
	p.exportAt(t, "big", 3)
	_, bigRemote := p.d2.open(t, "d1/big", wire.RightRead, wire.TransportAuto)
	slow := slowlyRegister(t, devs.fabricDevice("d1"), p.expMem(3*block, block))
	// One more than register and wait: that one is answered busy, once
	// the others wait.
	asked := make(chan exchanged, 2+maxExportWaiters)
	for range 2 + maxExportWaiters {
		go p.askRegion("big", asked)
	}
	if a := wait(t, asked, "the request for big beyond the bound"); a.err != nil || !bytes.Equal(a.resp, busyAnswer) {
		t.Fatalf("a request for big beyond the bound: %q, %v; want busyAnswer", a.resp, a.err)
	}
	j := pinJob{r: bigRemote, done: make(chan error, 1), deadline: time.Now().Add(200 * time.Millisecond)}
	p.d2.p.rdma.prep <- j
	err := wait(t, j.done, "a pin of big past its deadline")
	if !errors.Is(err, xfer.ErrBusy) || !errors.Is(err, errOwnerBusy) || !strings.Contains(err.Error(), "answered busy") {
		t.Fatalf("a pin of big while d1 registers it, past its deadline: %v; want errOwnerBusy", err)
	}
	if k := rdma.KeysOf(bigRemote); k != nil {
		t.Fatal("a pin that failed left keys on the segment")
	}
	slow.release()
	for range 1 + maxExportWaiters {
		if a := wait(t, asked, "a request for big"); a.err != nil {
			t.Fatalf("a request for big: %v", a.err)
		}
	}
}

// TestFabricOwnerWithNoHandlerFreeIsAskedAgain: an owner whose node has no
// exchange handler free (d1's are all held here by exchanges of another
// kind until the test lets them go) answers busy before serving a request
// for a registration; the requesting daemon asks again until its deadline
// and then fails BUSY, rather than taking the answer as the segment's
// failure; asked once handlers are free, it gets the keys.
func TestFabricOwnerWithNoHandlerFreeIsAskedAgain(t *testing.T) {
	devs := fabric()
	p := startPair(t, devs)
	p.exportAt(t, "big", 3)
	_, bigRemote := p.d2.open(t, "d1/big", wire.RightRead, wire.TransportAuto)
	p.d2.linkUp(t, p.kvRemote) // the link is up: only the resolution asks d1
	release := p.holdHandlers(t)

	j := pinJob{r: bigRemote, done: make(chan error, 1), deadline: time.Now().Add(200 * time.Millisecond)}
	p.d2.p.rdma.prep <- j
	err := wait(t, j.done, "a pin of big past its deadline")
	if !errors.Is(err, errOwnerBusy) || !errors.Is(err, xfer.ErrBusy) {
		t.Fatalf("a pin of big while d1 has no exchange handler free, past its deadline: %v; want errOwnerBusy", err)
	}
	if n := p.d2.counter(t, "rdma.owner_busy"); n == 0 {
		t.Fatal("d2 counts no busy answer")
	}
	release()
	if err := p.d2.prepare(bigRemote); err != nil {
		t.Fatalf("d2 resolving big once d1's handlers are free: %v", err)
	}
}

// TestFabricLinkAskedAgainWhilePeerBusy: a link made while the peer's node
// has no exchange handler free (its queue-pair exchange refused busy,
// before any handler ran) asks again within the exchange's timeout, and
// comes up once a handler is free, instead of failing and leaving the peer
// on tcp for linkRetry.
func TestFabricLinkAskedAgainWhilePeerBusy(t *testing.T) {
	devs := fabric()
	p := startPair(t, devs)
	release := p.holdHandlers(t)

	up := make(chan error, 1)
	go func() { up <- p.d2.prepare(p.kvRemote) }()
	testutil.Eventually(t, 10*time.Second, func() bool {
		select {
		case err := <-up:
			t.Fatalf("d2's link to d1 while d1 has no handler free ended before any was: %v", err)
		default:
		}
		return p.d2.counter(t, "rdma.link_peer_busy") > 0
	}, "d2 asking d1 again for the link")
	release()
	if err := wait(t, up, "d2's link to d1 once d1 has handlers free"); err != nil {
		t.Fatalf("d2's link to d1 once d1 has handlers free: %v\n%s", err, p.d2.log.String())
	}
	if p.d2.link("d1") == nil {
		t.Fatal("d2 has no rdma link to d1")
	}
}
