package xfer

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// countSeg is a MemSegment that counts its references and records a
// Release below zero.
type countSeg struct {
	id      SegmentID
	kind    Kind
	buf     []byte
	refs    atomic.Int64
	neg     atomic.Bool
	closing atomic.Bool
}

var _ MemSegment = (*countSeg)(nil)

func newSeg(id SegmentID, size int) *countSeg {
	return &countSeg{id: id, kind: KindPool, buf: make([]byte, size)}
}

func (s *countSeg) ID() SegmentID { return s.id }
func (s *countSeg) Kind() Kind    { return s.kind }
func (s *countSeg) Size() uint64  { return uint64(len(s.buf)) }
func (s *countSeg) Bytes() []byte { return s.buf }
func (s *countSeg) Acquire() bool {
	if s.closing.Load() {
		return false
	}
	s.refs.Add(1)
	return true
}
func (s *countSeg) Release() {
	if s.refs.Add(-1) < 0 {
		s.neg.Store(true)
	}
}

// checkRefs fails t unless every segment is back to zero references and
// none was ever released below zero.
func checkRefs(t testing.TB, segs ...*countSeg) {
	t.Helper()
	for _, s := range segs {
		if r := s.refs.Load(); r != 0 {
			t.Errorf("segment %d: %d refs outstanding, want 0", s.id, r)
		}
		if s.neg.Load() {
			t.Errorf("segment %d: released below zero", s.id)
		}
	}
}

// oneRouter routes every request to tr.
type oneRouter struct{ tr Transport }

func (r oneRouter) Route(_, _ Segment) (Transport, error) { return r.tr, nil }

// errRouter refuses every request.
type errRouter struct{ err error }

func (r errRouter) Route(_, _ Segment) (Transport, error) { return nil, r.err }

// syncTr ends every task inside Submit with its full length.
type syncTr struct{ submits atomic.Int64 }

var _ Transport = (*syncTr)(nil)

func (f *syncTr) Name() string { return "sync" }
func (f *syncTr) Submit(ts []*Task) (int, error) {
	f.submits.Add(1)
	for _, t := range ts {
		t.Done(t.Req.Length, nil)
	}
	return len(ts), nil
}
func (f *syncTr) Cancel(*Task) {}
func (f *syncTr) Close() error { return nil }

// asyncTr keeps dispatched tasks until the test ends them. It dispatches
// at most limit tasks per Submit (0: no limit) and then fails with
// errInjected, and optionally ends canceled tasks at once.
type asyncTr struct {
	name        string
	limit       int
	doneInline  bool // end the dispatched tasks inside Submit
	doneCancel  bool // end a task with ErrCanceled when it is canceled
	onSubmit    func(ts []*Task)
	mu          sync.Mutex // guards the fields below
	held        []*Task
	canceled    int
	closed      bool
	seenReqs    []Request
	submitCalls int
}

var errInjected = errors.New("fake: injected dispatch failure")

var _ Transport = (*asyncTr)(nil)

func (f *asyncTr) Name() string {
	if f.name == "" {
		return "async"
	}
	return f.name
}

func (f *asyncTr) Submit(ts []*Task) (int, error) {
	if f.onSubmit != nil {
		f.onSubmit(ts)
	}
	f.mu.Lock()
	f.submitCalls++
	if f.closed {
		f.mu.Unlock()
		return 0, ErrClosed
	}
	n := len(ts)
	var err error
	if f.limit > 0 && n > f.limit || f.limit < 0 {
		n, err = max(f.limit, 0), errInjected
	}
	for _, t := range ts[:n] {
		f.seenReqs = append(f.seenReqs, t.Req)
	}
	if !f.doneInline {
		f.held = append(f.held, ts[:n]...)
	}
	f.mu.Unlock()
	if f.doneInline {
		for _, t := range ts[:n] {
			t.Done(t.Req.Length, nil)
		}
	}
	return n, err
}

func (f *asyncTr) Cancel(t *Task) {
	f.mu.Lock()
	f.canceled++
	found := false
	if f.doneCancel {
		for i, h := range f.held {
			if h == t {
				f.held = append(f.held[:i], f.held[i+1:]...)
				found = true
				break
			}
		}
	}
	f.mu.Unlock()
	if found {
		t.Done(0, ErrCanceled)
	}
}

// finish ends every held task with err (nil: its full length).
func (f *asyncTr) finish(err error) int {
	f.mu.Lock()
	held := f.held
	f.held = nil
	f.mu.Unlock()
	for _, t := range held {
		if err == nil {
			t.Done(t.Req.Length, nil)
		} else {
			t.Done(0, err)
		}
	}
	return len(held)
}

func (f *asyncTr) Close() error {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.finish(ErrClosed)
	return nil
}

func (f *asyncTr) heldCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held)
}

func (f *asyncTr) canceledCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.canceled
}

// liarTr breaks the count contract: it ends tasks[:done] inside Submit
// (twice each when double is set) and returns (n, err) as configured.
type liarTr struct {
	n      func(l int) int
	done   func(l int) int
	err    error
	double bool
}

func (f *liarTr) Name() string { return "liar" }
func (f *liarTr) Submit(ts []*Task) (int, error) {
	d := min(f.done(len(ts)), len(ts))
	for _, t := range ts[:d] {
		t.Done(t.Req.Length, nil)
		if f.double {
			t.Done(t.Req.Length, nil)
		}
	}
	return f.n(len(ts)), f.err
}
func (f *liarTr) Cancel(*Task) {}
func (f *liarTr) Close() error { return nil }

// fixture is an engine over a registry of two counting segments.
type fixture struct {
	e    *Engine
	reg  *Registry
	a, b *countSeg
	opts SubmitOptions
}

func newFixture(t testing.TB, cfg Config, r Router) *fixture {
	t.Helper()
	f := &fixture{e: NewEngine(cfg, r, nil), reg: NewRegistry(), a: newSeg(1, 1<<16), b: newSeg(2, 1<<16)}
	for _, s := range []*countSeg{f.a, f.b} {
		if err := f.reg.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	f.opts = SubmitOptions{Resolver: f.reg}
	return f
}

// reqs returns n valid write requests of 64 bytes each from a to b.
func (f *fixture) reqs(n int) []Request {
	rs := make([]Request, n)
	for i := range rs {
		rs[i] = Request{Op: OpWrite, Local: 1, LocalOffset: uint64(i * 64), Target: 2, TargetOffset: uint64(i * 64), Length: 64}
	}
	return rs
}

func (f *fixture) status(t testing.TB, id BatchID, i int) TaskStatus {
	t.Helper()
	st, err := f.e.Status(id, i)
	if err != nil {
		t.Fatalf("Status(%d): %v", i, err)
	}
	return st
}
