package rdma

import (
	"errors"
	"sync"
	"unsafe"
)

// fakeFabric stands in for a device: queue pairs that execute RDMA READ and
// WRITE with memmove between addresses of this process, and a completion
// queue with a wake-up channel. Work can be held (posted, not executed) to
// test what happens to work in flight.
type fakeFabric struct {
	mu      sync.Mutex // guards every field below
	wcs     []completion
	armed   bool
	hold    bool
	posts   int // post calls
	posted  int // work requests posted
	signals int // signalled work requests executed
	conns   int // connect calls
	qpns    uint32

	event chan struct{} // an armed completion arrived
	woken chan struct{} // wake was called
}

func newFakeFabric() *fakeFabric {
	return &fakeFabric{event: make(chan struct{}, 1), woken: make(chan struct{}, 1)}
}

// fakeMem maps the addresses the fakes see back to the test's buffers
// (vet rightly refuses turning integers into pointers).
var fakeMem memMap

type memMap struct {
	mu   sync.Mutex // guards bufs
	bufs [][]byte
}

// addrOf is b's address, remembered for resolve.
func addrOf(b []byte) uint64 {
	fakeMem.mu.Lock()
	defer fakeMem.mu.Unlock()
	fakeMem.bufs = append(fakeMem.bufs, b)
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}

func (m *memMap) resolve(addr uint64, n uint32) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range m.bufs {
		base := uint64(uintptr(unsafe.Pointer(&b[0])))
		if addr >= base && addr+uint64(n) <= base+uint64(len(b)) {
			return b[addr-base : addr-base+uint64(n)]
		}
	}
	panic("fake: address outside every test buffer")
}

type fakeQP struct {
	f      *fakeFabric
	num    uint32
	buf    []workRequest
	queued []workRequest // held work, guarded by f.mu
	failed bool          // guarded by f.mu
}

func (f *fakeFabric) newQP(depth int) *fakeQP {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.qpns++
	return &fakeQP{f: f, num: f.qpns, buf: make([]workRequest, depth)}
}

// push adds a completion; f.mu is held.
func (f *fakeFabric) push(c completion) {
	f.wcs = append(f.wcs, c)
	if f.armed {
		f.armed = false
		select {
		case f.event <- struct{}{}:
		default:
		}
	}
}

func (q *fakeQP) wrBuf() []workRequest { return q.buf }

func (q *fakeQP) post(n int) (int, error) {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	q.f.posts++
	q.f.posted += n
	for _, w := range q.buf[:n] {
		switch {
		case q.failed:
			q.f.push(completion{id: w.id, status: uint32(WCWRFlushErr)})
		case q.f.hold:
			q.queued = append(q.queued, w)
		default:
			q.exec(w)
		}
	}
	return n, nil
}

// exec performs one work request; f.mu is held.
func (q *fakeQP) exec(w workRequest) {
	if w.length > 0 {
		l, r := fakeMem.resolve(w.laddr, w.length), fakeMem.resolve(w.raddr, w.length)
		if w.op == opWrite {
			copy(r, l)
		} else {
			copy(l, r)
		}
	}
	if w.signaled == 1 {
		q.f.signals++
		q.f.push(completion{id: w.id, status: uint32(WCSuccess), byteLen: w.length})
	}
}

// release executes held work.
func (f *fakeFabric) release(qs ...*fakeQP) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hold = false
	for _, q := range qs {
		for _, w := range q.queued {
			q.exec(w)
		}
		q.queued = nil
	}
}

func (q *fakeQP) connect(local, remote *ConnInfo) error {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	q.f.conns++
	if remote.GID == (GID{0xde, 0xad}) {
		return errors.New("fake: unreachable gid")
	}
	q.failed = false
	return nil
}

func (q *fakeQP) fail() error {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	q.failed = true
	for _, w := range q.queued {
		q.f.push(completion{id: w.id, status: uint32(WCWRFlushErr)})
	}
	q.queued = nil
	return nil
}

func (q *fakeQP) reset() error {
	q.f.mu.Lock()
	defer q.f.mu.Unlock()
	q.queued = nil
	return nil
}

func (q *fakeQP) qpn() uint32    { return q.num }
func (q *fakeQP) destroy() error { return nil }

type fakeCQ struct{ f *fakeFabric }

func (c fakeCQ) poll(wcs []completion) (int, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	n := copy(wcs, c.f.wcs)
	c.f.wcs = c.f.wcs[:copy(c.f.wcs, c.f.wcs[n:])]
	return n, nil
}

func (c fakeCQ) arm() error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.f.armed = true
	return nil
}

func (c fakeCQ) wait() (bool, error) {
	select {
	case <-c.f.event:
		return true, nil
	case <-c.f.woken:
		return false, nil
	}
}

func (c fakeCQ) wake() {
	select {
	case c.f.woken <- struct{}{}:
	default:
	}
}

func (c fakeCQ) destroy() error { return nil }
