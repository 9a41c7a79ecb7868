// Package xfertest holds the test doubles of the transfer engine's
// interfaces, one set that every package's tests share: a Transport that a
// test holds, finishes, fails and cancels, and that records what it was
// given; Segments that count their references and can be closed; and
// Routers.
//
// The doubles keep the xfer.Transport contract unless a test asks them to
// break it (Config.Lie): every task a Submit takes is ended by exactly one
// Done, Close ends every held task and refuses later Submits, and Cancel of
// a task the transport no longer holds does nothing.
package xfertest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/xfer"
)

// ErrInjected is the error the doubles fail with when a test asks for a
// failure without naming one. It is in no category: it stands for an error
// nobody foresaw, which a client sees as INTERNAL.
var ErrInjected = errors.New("xfertest: injected failure")

// Config says how a Transport behaves. The zero Config takes every task and
// holds it until the test ends it.
type Config struct {
	// Name is the transport's Name ("xfertest" when empty).
	Name string
	// Inline ends every task Submit takes before Submit returns. Without
	// it the transport holds the tasks until the test ends them (Finish,
	// Fail, Take), Cancel does (CancelEnds) or Close does.
	Inline bool
	// Hold, when set, picks tasks that are held even when Inline is set.
	Hold func(t *xfer.Task) bool
	// Limit > 0 takes at most Limit tasks per Submit, Limit < 0 takes
	// none; Submit then returns the count it took and LimitErr
	// (ErrInjected when nil).
	Limit    int
	LimitErr error
	// Lie, when set, replaces what Submit returns (after Limit) with what
	// it returns, while the transport takes max(0, min(n, len(tasks)))
	// tasks whatever it says: a transport that breaks the count contract.
	Lie func(n int, err error) (int, error)
	// Disown, with Lie, takes the tasks Limit lets through (all of them
	// without a Limit) whatever count Lie reports: a transport that ends
	// or holds tasks past the count it reports.
	Disown bool
	// CancelEnds ends a held task with xfer.ErrCanceled when it is
	// canceled. Without it Cancel is only counted, as by a transport whose
	// tasks end on their own.
	CancelEnds bool
	// Err, when set, is asked about every task the transport carries out
	// (inline or by Finish): a non-nil error ends the task with it, and no
	// bytes move.
	Err func(t *xfer.Task) error
	// Move, when set, carries out a task that Err let through and returns
	// its result; nil ends the task with its full length and no bytes
	// moved. Copy is a Move that copies between memory segments.
	Move func(t *xfer.Task) (uint64, error)
	// LIFO makes Finish end the held tasks newest first.
	LIFO bool
	// Record keeps the Request of every task taken, for Requests.
	Record bool
	// OnSubmit runs at the start of every Submit with every task given,
	// before anything is taken.
	OnSubmit func(ts []*xfer.Task)
	// AfterSubmit runs at the end of every Submit, after the inline tasks
	// ended, just before Submit returns.
	AfterSubmit func()
}

// Transport is an in-memory xfer.Transport that does what its Config says.
// It is safe for concurrent use; Config hooks run without its lock held.
type Transport struct {
	// mu guards the fields below.
	mu     sync.Mutex
	cfg    Config
	held   []*xfer.Task
	spare  []*xfer.Task // a drained held slice, reused so Finish allocates nothing
	reqs   []xfer.Request
	closed bool
	gen    uint64 // counts Updates: a Submit that read an older Config decides again before it holds

	// active counts the Submits between taking tasks and holding or
	// ending them; Close waits for it.
	active sync.WaitGroup

	submits, cancels, ended atomic.Int64
	holding                 chan struct{}
}

var _ xfer.Transport = (*Transport)(nil)

// New returns a Transport that behaves as cfg says.
func New(cfg Config) *Transport {
	return &Transport{cfg: cfg, holding: make(chan struct{}, 1)}
}

// Update changes how the transport behaves from now on: fn edits its
// Config under the transport's lock. Tasks already held stay held, and a
// Submit in progress holds no task by the Config that Update replaced: once
// Update returns, a test that then ends every held task has ended every
// task held by the old Config.
func (f *Transport) Update(fn func(c *Config)) {
	f.mu.Lock()
	fn(&f.cfg)
	f.gen++
	f.mu.Unlock()
}

// Name is Config.Name, or "xfertest".
func (f *Transport) Name() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cfg.Name == "" {
		return "xfertest"
	}
	return f.cfg.Name
}

// Submit takes tasks as the Config says: all of them, or Limit of them,
// ending them inline or holding them.
func (f *Transport) Submit(ts []*xfer.Task) (int, error) {
	f.submits.Add(1)
	f.mu.Lock()
	cfg, gen := f.cfg, f.gen
	f.mu.Unlock()
	if cfg.OnSubmit != nil {
		cfg.OnSubmit(ts)
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return 0, xfer.ErrClosed
	}
	n, err := len(ts), error(nil)
	if cfg.Limit < 0 || cfg.Limit > 0 && n > cfg.Limit {
		n, err = max(cfg.Limit, 0), cfg.LimitErr
		if err == nil {
			err = ErrInjected
		}
	}
	took := n
	if cfg.Lie != nil {
		n, err = cfg.Lie(n, err)
		if !cfg.Disown {
			took = n
		}
	}
	take := ts[:max(0, min(took, len(ts)))]
	if cfg.Record {
		for _, t := range take {
			f.reqs = append(f.reqs, t.Req)
		}
	}
	f.active.Add(1) // Close waits for the tasks taken here
	f.mu.Unlock()
	held := false
	// Each task is looked at once, before it is held: once held, another
	// goroutine may end it, and its memory is then no longer ours.
	for _, t := range take {
		if f.holdOrCarry(t, &cfg, &gen) {
			held = true
		}
	}
	f.active.Done()
	if held {
		select {
		case f.holding <- struct{}{}:
		default:
		}
	}
	if cfg.AfterSubmit != nil {
		cfg.AfterSubmit()
	}
	return n, err
}

// holdOrCarry ends t inline or holds it, as cfg says, and reports whether
// it held it. An Update since cfg was read (gen) makes it decide again by
// the Config that Update made (cfg and gen then hold the new ones), so no
// task is held by a Config a test has replaced after it ended what was
// held.
func (f *Transport) holdOrCarry(t *xfer.Task, cfg *Config, gen *uint64) bool {
	for {
		if cfg.Inline && (cfg.Hold == nil || !cfg.Hold(t)) {
			f.carryOut(t, *cfg)
			return false
		}
		f.mu.Lock()
		if f.gen == *gen {
			f.held = append(f.held, t)
			f.mu.Unlock()
			return true
		}
		*cfg, *gen = f.cfg, f.gen
		f.mu.Unlock()
	}
}

// carryOut ends t as the Config says: with Err's error, or Move's result,
// or its full length.
func (f *Transport) carryOut(t *xfer.Task, cfg Config) {
	if cfg.Err != nil {
		if err := cfg.Err(t); err != nil {
			f.end(t, 0, err)
			return
		}
	}
	if cfg.Move != nil {
		n, err := cfg.Move(t)
		f.end(t, n, err)
		return
	}
	f.end(t, t.Req.Length, nil)
}

func (f *Transport) end(t *xfer.Task, n uint64, err error) {
	f.ended.Add(1)
	t.Done(n, err)
}

// Cancel counts the call and, with CancelEnds, ends t with
// xfer.ErrCanceled if the transport still holds it.
func (f *Transport) Cancel(t *xfer.Task) {
	f.cancels.Add(1)
	f.mu.Lock()
	found := false
	if f.cfg.CancelEnds {
		if i := slices.Index(f.held, t); i >= 0 {
			f.held = slices.Delete(f.held, i, i+1)
			found = true
		}
	}
	f.mu.Unlock()
	if found {
		f.end(t, 0, xfer.ErrCanceled)
	}
}

// Close refuses later Submits with xfer.ErrClosed, waits for the Submits
// in progress, and ends every held task with xfer.ErrClosed. Config hooks
// must not call it.
func (f *Transport) Close() error {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.active.Wait()
	for _, t := range f.drain(-1, false) {
		f.end(t, 0, xfer.ErrClosed)
	}
	return nil
}

// Finish carries out every task the transport holds, oldest first (newest
// first with LIFO), as Submit would have inline, and returns how many it
// ended. Tasks held while it runs stay held.
func (f *Transport) Finish() int {
	f.mu.Lock()
	cfg := f.cfg
	f.mu.Unlock()
	ts := f.drain(-1, cfg.LIFO)
	for _, t := range ts {
		f.carryOut(t, cfg)
	}
	f.recycle(ts)
	return len(ts)
}

// Fail ends every task the transport holds with err (ErrInjected when
// nil) and no bytes, and returns how many it ended.
func (f *Transport) Fail(err error) int {
	if err == nil {
		err = ErrInjected
	}
	ts := f.drain(-1, false)
	for _, t := range ts {
		f.end(t, 0, err)
	}
	f.recycle(ts)
	return len(ts)
}

// Take removes the n oldest held tasks (every one when n < 0) and returns
// them: the test now owes each of them its one Done, and may end them in
// any order, with any result.
func (f *Transport) Take(n int) []*xfer.Task {
	ts := f.drain(n, false)
	out := slices.Clone(ts)
	f.recycle(ts)
	return out
}

// drain removes the n oldest held tasks (all when n < 0), in the order
// asked. The slice it returns is the transport's until recycle.
func (f *Transport) drain(n int, lifo bool) []*xfer.Task {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n < 0 || n > len(f.held) {
		n = len(f.held)
	}
	var ts []*xfer.Task
	if n == len(f.held) {
		ts, f.held, f.spare = f.held, f.spare, nil
	} else {
		ts = slices.Clone(f.held[:n])
		f.held = slices.Delete(f.held, 0, n)
	}
	if lifo {
		slices.Reverse(ts)
	}
	return ts
}

// recycle keeps a drained slice for the next drain, so that holding and
// finishing in a loop allocates nothing once the slices have grown.
func (f *Transport) recycle(ts []*xfer.Task) {
	clear(ts)
	f.mu.Lock()
	if f.spare == nil {
		f.spare = ts[:0]
	}
	f.mu.Unlock()
}

// Held is the number of tasks the transport holds.
func (f *Transport) Held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held)
}

// Holding receives after a Submit held at least one task. It has room for
// one signal: Submits that hold while it is full are folded into it.
func (f *Transport) Holding() <-chan struct{} { return f.holding }

// Submits is the number of Submit calls, refused ones included.
func (f *Transport) Submits() int { return int(f.submits.Load()) }

// Cancels is the number of Cancel calls.
func (f *Transport) Cancels() int { return int(f.cancels.Load()) }

// Ended is the number of Done calls the transport made (tasks a test took
// with Take and ended itself are not counted).
func (f *Transport) Ended() int { return int(f.ended.Load()) }

// Requests returns the Request of every task taken since the transport was
// made, in order (only while Config.Record is set).
func (f *Transport) Requests() []xfer.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

// Copy is a Config.Move that copies t's bytes between its two memory
// segments in the direction of its Op. A task whose segments are not
// xfer.MemSegments, or whose range does not fit, ends with xfer.ErrInvalid.
func Copy(t *xfer.Task) (uint64, error) {
	l, ok := t.Local.(xfer.MemSegment)
	tg, ok2 := t.Target.(xfer.MemSegment)
	if !ok || !ok2 {
		return 0, fmt.Errorf("%w: xfertest: copy needs two memory segments", xfer.ErrInvalid)
	}
	q := t.Req
	lb, tb := l.Bytes(), tg.Bytes()
	if q.LocalOffset > uint64(len(lb)) || q.Length > uint64(len(lb))-q.LocalOffset ||
		q.TargetOffset > uint64(len(tb)) || q.Length > uint64(len(tb))-q.TargetOffset {
		return 0, fmt.Errorf("%w: xfertest: copy out of bounds: %+v", xfer.ErrInvalid, q)
	}
	lb, tb = lb[q.LocalOffset:q.LocalOffset+q.Length], tb[q.TargetOffset:q.TargetOffset+q.Length]
	switch q.Op {
	case xfer.OpWrite:
		copy(tb, lb)
	case xfer.OpRead:
		copy(lb, tb)
	default:
		return 0, fmt.Errorf("%w: xfertest: op %d", xfer.ErrInvalid, q.Op)
	}
	return q.Length, nil
}
