package link

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// regSeg is a memory segment for the registration queue's test.
type regSeg struct {
	id  xfer.SegmentID
	b   []byte
	ref atomic.Int64
}

func (s *regSeg) ID() xfer.SegmentID { return s.id }
func (s *regSeg) Kind() xfer.Kind    { return xfer.KindClient }
func (s *regSeg) Size() uint64       { return uint64(len(s.b)) }
func (s *regSeg) Bytes() []byte      { return s.b }
func (s *regSeg) Acquire() bool      { s.ref.Add(1); return true }
func (s *regSeg) Release()           { s.ref.Add(-1) }

// regResolver resolves the test's segments.
type regResolver map[xfer.SegmentID]xfer.Segment

func (r regResolver) Resolve(id xfer.SegmentID) (xfer.Segment, bool) { s, ok := r[id]; return s, ok }

// fakeRegistrar stands in for the device: each registration blocks until
// the test releases that buffer, and says how it went.
type fakeRegistrar struct {
	mu      sync.Mutex // guards calls
	calls   map[xfer.SegmentID]int
	started chan xfer.SegmentID
	release map[xfer.SegmentID]chan bool
}

func (f *fakeRegistrar) register(seg xfer.Segment) bool {
	f.mu.Lock()
	f.calls[seg.ID()]++
	ch := f.release[seg.ID()]
	f.mu.Unlock()
	f.started <- seg.ID()
	return <-ch
}

func (f *fakeRegistrar) count(id xfer.SegmentID) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

// sinkTr ends every task it gets at once, counting them.
type sinkTr struct {
	mu  sync.Mutex // guards got
	got []*xfer.Task
	err error
}

func (s *sinkTr) Name() string { return "link" }
func (s *sinkTr) Submit(ts []*xfer.Task) (int, error) {
	s.mu.Lock()
	s.got = append(s.got, ts...)
	s.mu.Unlock()
	for _, t := range ts {
		t.Done(t.Req.Length, s.err)
	}
	return len(ts), nil
}
func (s *sinkTr) Cancel(*xfer.Task) {}
func (s *sinkTr) Close() error      { return nil }

func (s *sinkTr) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

// TestRegistrationQueue drives the registration queue through the engine,
// with a device that registers only when the test says so: Submit returns
// at once; concurrent requests for one buffer share one registration;
// they move on (to the link) only once it is done; a registration that
// fails fails its waiters, and is not tried again; a request whose
// deadline passes while its buffer registers ends Timeout without waiting
// for it; closing the queue fails what waits and waits for the
// registration in progress.
func TestRegistrationQueue(t *testing.T) {
	fr := &fakeRegistrar{calls: map[xfer.SegmentID]int{}, started: make(chan xfer.SegmentID, 8),
		release: map[xfer.SegmentID]chan bool{1: make(chan bool), 2: make(chan bool), 3: make(chan bool)}}
	link := &sinkTr{}
	missing := &sinkTr{err: errors.New("no registration")}
	registered := map[xfer.SegmentID]bool{}
	var regMu sync.Mutex
	q := newRegQueue(slog.New(slog.DiscardHandler), func(seg xfer.Segment) bool {
		ok := fr.register(seg)
		regMu.Lock()
		registered[seg.ID()] = ok
		regMu.Unlock()
		return ok
	}, func(t *xfer.Task) xfer.Transport {
		regMu.Lock()
		defer regMu.Unlock()
		if registered[t.Req.Local] {
			return link
		}
		return missing
	})
	ran := make(chan struct{})
	go func() { defer close(ran); q.run() }()

	bufA, bufB, bufC := &regSeg{id: 1, b: make([]byte, 1<<16)}, &regSeg{id: 2, b: make([]byte, 1<<16)}, &regSeg{id: 3, b: make([]byte, 1<<16)}
	target := &regSeg{id: 9, b: make([]byte, 1<<16)}
	res := regResolver{1: bufA, 2: bufB, 3: bufC, 9: target}
	e := xfer.NewEngine(xfer.Config{}, oneRoute{q}, nil)
	defer e.Close()
	req := func(local xfer.SegmentID, off uint64) xfer.Request {
		return xfer.Request{Op: xfer.OpWrite, Local: local, LocalOffset: off, Target: 9, TargetOffset: off, Length: 4096}
	}
	submit := func(deadline time.Time, reqs ...xfer.Request) xfer.BatchID {
		t.Helper()
		id, err := e.AllocateBatch(len(reqs))
		if err != nil {
			t.Fatal(err)
		}
		out := make([]error, len(reqs))
		start := time.Now()
		if err := e.Submit(id, reqs, xfer.SubmitOptions{Resolver: res, Deadline: deadline}, out); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 100*time.Millisecond {
			t.Fatalf("Submit took %v while a registration is in progress", took)
		}
		for i, err := range out {
			if err != nil {
				t.Fatalf("request %d refused: %v", i, err)
			}
		}
		return id
	}
	far := time.Now().Add(time.Minute)

	// Two calls for buffer A while its registration hangs: one
	// registration, nothing moves.
	b1 := submit(far, req(1, 0), req(1, 4096))
	if got := <-fr.started; got != 1 {
		t.Fatalf("registration of %d started, want 1", got)
	}
	b2 := submit(far, req(1, 8192))
	// B queues behind A; a short deadline on one of its requests.
	short := time.Now().Add(200 * time.Millisecond)
	b3 := submit(short, req(2, 0))
	if s, _ := e.BatchStatus(b3); s.Pending != 1 {
		t.Fatalf("B's request before its registration: %+v", s)
	}
	// The engine's deadline cancels B's request, which ends at once (its
	// registration has not even started).
	if s, err := e.Wait(b3, time.Now().Add(5*time.Second)); err != nil || s.Timeout != 1 {
		t.Fatalf("B's request past its deadline: %+v, %v", s, err)
	}
	if link.count() != 0 || q.waiters() != 3 {
		t.Fatalf("before A's registration: %d moved, %d waiting; want 0 and 3", link.count(), q.waiters())
	}
	if fr.count(1) != 1 {
		t.Fatalf("buffer A registered %d times, want once", fr.count(1))
	}
	fr.release[1] <- true
	for _, b := range []xfer.BatchID{b1, b2} {
		if s, err := e.Wait(b, time.Now().Add(5*time.Second)); err != nil || s.Completed != s.Total {
			t.Fatalf("A's requests after its registration: %+v, %v", s, err)
		}
	}
	if link.count() != 3 {
		t.Fatalf("%d of A's requests reached the link, want 3", link.count())
	}

	// B's registration (nobody waits for it any more) fails: later
	// requests from B fail, and B is not registered again.
	if got := <-fr.started; got != 2 {
		t.Fatalf("registration of %d started, want 2", got)
	}
	fr.release[2] <- false
	// Whether this one joins the failing registration or comes after it,
	// it fails; once it has, the failure is on record.
	b4 := submit(far, req(2, 0))
	if s, err := e.Wait(b4, time.Now().Add(5*time.Second)); err != nil || s.Failed != 1 {
		t.Fatalf("request from a buffer whose registration failed: %+v, %v", s, err)
	}
	if !q.hasFailed(2) {
		t.Fatal("B's failed registration is not remembered")
	}
	b4b := submit(far, req(2, 4096))
	if s, err := e.Wait(b4b, time.Now().Add(5*time.Second)); err != nil || s.Failed != 1 {
		t.Fatalf("later request from the failed buffer: %+v, %v", s, err)
	}
	if fr.count(2) != 1 {
		t.Fatalf("buffer B registered %d times, want once", fr.count(2))
	}

	// C's registration hangs while the queue closes: its waiter fails
	// ErrClosed at once, and close waits for the registration to end.
	b5 := submit(far, req(3, 0))
	if got := <-fr.started; got != 3 {
		t.Fatalf("registration of %d started, want 3", got)
	}
	closed := make(chan struct{})
	go func() { q.close(); close(closed) }()
	if s, err := e.Wait(b5, time.Now().Add(5*time.Second)); err != nil || s.Failed != 1 {
		t.Fatalf("waiter when the queue closed: %+v, %v", s, err)
	}
	if st, _ := e.Status(b5, 0); !errors.Is(st.Err, xfer.ErrClosed) {
		t.Fatalf("waiter when the queue closed ended with %v", st.Err)
	}
	select {
	case <-closed:
		t.Fatal("close returned while a registration was still running")
	default:
	}
	fr.release[3] <- true
	<-closed
	<-ran
	if n, err := q.Submit(nil); n != 0 || !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("Submit after close: %d, %v", n, err)
	}
	for _, b := range []xfer.BatchID{b1, b2, b3, b4, b4b, b5} {
		if err := e.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*regSeg{bufA, bufB, bufC, target} {
		if r := s.ref.Load(); r != 0 {
			t.Fatalf("segment %d: %d references left", s.id, r)
		}
	}
}

// oneRoute sends every request to one transport.
type oneRoute struct{ tr xfer.Transport }

func (r oneRoute) Route(_, _ xfer.Segment) (xfer.Transport, error) { return r.tr, nil }
