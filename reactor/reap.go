package reactor

// Completions a worker reaps itself: a transport whose requests the worker
// posts on its thread (the rdma transport's queue pairs) gives it a Reaper,
// polled after every pass, whose Sleep takes part in the worker's one
// sleep.

import (
	"fmt"

	"github.com/tensorcast/tensorcast/uring"
)

// Reaper is the completion work a transport leaves to the worker that
// posted the requests (rdma.Home). Reap, Sleep, Fired and Stop run on the
// worker's thread.
type Reaper interface {
	// Bind gives the reaper the worker's wake-up, which any goroutine may
	// call: it ends the worker's sleep (or makes its next one return at
	// once). polls says the worker's Sleep passes the reaper waits on its
	// ring (a hosted worker); otherwise it passes none, and the reaper's
	// transport calls wake when a completion it armed for comes.
	Bind(wake func(), polls bool)
	// Reap takes what completed and ends its requests; it reports
	// whether it did any work.
	Reap() bool
	// Sleep prepares the worker's sleep: it arms whatever must wake the
	// worker on the next completion (a poll of a completion channel on
	// ws, the worker's ring, when ws is not nil), and reports false when
	// the worker must not sleep yet (completions came meanwhile, or the
	// reaper keeps polling for a while after its last one).
	Sleep(ws ReaperWaits) bool
	// Fired reports that the wait the reaper armed on ws with token
	// ended, with the kernel's result (a poll's revents, or a negative
	// errno).
	Fired(token uint32, res int32)
	// Stop is called once, on the worker's thread, when the worker stops:
	// the reaper hands what it would have reaped to someone else (the
	// transport's own goroutines), so that nothing in flight waits for a
	// worker that is gone.
	Stop()
}

// ReaperWaits is what a hosted worker's sleep lends its reapers: a
// one-shot poll of a file for POLLIN on the worker's ring
// (uring.Waits.PollWait), and the cancel of one, with tokens of
// ReaperTokenBits bits. It is an alias of an interface literal, so that a
// transport implements Reaper without importing this package.
type ReaperWaits = interface {
	PollWait(fd int, token uint32)
	CancelWait(token uint32) bool
}

// ReaperTokenBits is how many low bits of a token a reaper may use.
const ReaperTokenBits = 24

// A reaper's token on the ring: reaperTag, the reaper's index, its own
// token. Queue tokens (served.token) never have reaperTag: a worker serves
// fewer than maxQueues queues.
const (
	reaperTag       = 1 << 31
	maxReapers      = 1 << (31 - ReaperTokenBits)
	reaperTokenMask = 1<<ReaperTokenBits - 1
)

// reaperWaits maps one reaper's tokens into the worker's (one per
// reaper, made once: the worker's sleep allocates nothing).
type reaperWaits struct {
	ws  uring.Waits
	tag uint32
}

func (r *reaperWaits) PollWait(fd int, token uint32) {
	r.ws.PollWait(fd, r.tag|token&reaperTokenMask)
}

func (r *reaperWaits) CancelWait(token uint32) bool {
	return r.ws.CancelWait(r.tag | token&reaperTokenMask)
}

// AddReaper gives worker w a reaper, which it polls after each pass from
// its next one on, for its life. It fails with ErrStopped when the worker
// stopped.
func (p *Pool) AddReaper(w int, r Reaper) error {
	if w < 0 || w >= len(p.workers) {
		return fmt.Errorf("%w: reaper for worker %d of %d", ErrConfig, w, len(p.workers))
	}
	wk := p.workers[w]
	wk.mu.Lock()
	if wk.stopped {
		wk.mu.Unlock()
		return fmt.Errorf("%w: worker %d", ErrStopped, wk.id)
	}
	if wk.nReapers == maxReapers {
		wk.mu.Unlock()
		return fmt.Errorf("%w: worker %d has %d reapers already", ErrConfig, wk.id, maxReapers)
	}
	wk.nReapers++
	// Bound before the worker takes it in: its first Sleep already
	// knows whether it polls.
	r.Bind(wk.wake, wk.thread == nil)
	wk.addReapers = append(wk.addReapers, r)
	wk.changed.Store(true)
	wk.mu.Unlock()
	wk.wake()
	return nil
}

// stopReapers stops the worker's reapers (on its thread, as it stops).
func (w *Worker) stopReapers() {
	w.mu.Lock()
	w.takeReapers()
	w.mu.Unlock()
	for _, r := range w.reapers {
		r.Stop()
	}
	w.reapers = nil
}

// takeReapers moves the reapers AddReaper queued (w.mu held, by apply).
func (w *Worker) takeReapers() {
	for _, r := range w.addReapers {
		w.rwaits = append(w.rwaits, &reaperWaits{tag: reaperTag | uint32(len(w.reapers))<<ReaperTokenBits})
		w.reapers = append(w.reapers, r)
	}
	w.addReapers = nil
}

// reap runs every reaper after a pass; it reports whether one did work.
func (w *Worker) reap() bool {
	did := false
	for _, r := range w.reapers {
		if r.Reap() {
			did = true
		}
	}
	return did
}

// reapersSleep asks every reaper whether the worker may sleep, arming
// their wake-ups (on ws, the worker's ring, when the worker is hosted);
// false as soon as one says no.
func (w *Worker) reapersSleep(ws uring.Waits) bool {
	for i, r := range w.reapers {
		ok := false
		if w.thread == nil {
			rw := w.rwaits[i]
			rw.ws = ws
			ok = r.Sleep(rw)
		} else {
			ok = r.Sleep(nil)
		}
		if !ok {
			return false
		}
	}
	return true
}

// reaperFired hands a reaper's token back to it.
func (w *Worker) reaperFired(token uint32, res int32) {
	if i := int(token&^reaperTag) >> ReaperTokenBits; i < len(w.reapers) {
		w.reapers[i].Fired(token&reaperTokenMask, res)
	}
}
