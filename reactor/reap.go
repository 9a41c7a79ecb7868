package reactor

// Completions a worker reaps itself: a transport whose requests the worker
// posts on its thread (the rdma transport's queue pairs) gives it a Reaper,
// polled after every pass, whose Sleep takes part in the worker's one
// sleep.

import "fmt"

// Reaper is the completion work a transport leaves to the worker that
// posted the requests (rdma.Home). Reap and Sleep run on the worker's
// thread.
type Reaper interface {
	// Bind gives the reaper the worker's wake-up, which any goroutine may
	// call: it ends the worker's sleep (or makes its next one return at
	// once). The reaper calls it when a completion it armed for comes.
	Bind(wake func())
	// Reap takes what completed and ends its requests; it reports
	// whether it did any work.
	Reap() bool
	// Sleep prepares the worker's sleep: it arms whatever must wake the
	// worker on the next completion, and reports false when the worker
	// must not sleep yet (completions came meanwhile, or the reaper keeps
	// polling for a while after its last one).
	Sleep() bool
	// Stop is called once, on the worker's thread, when the worker stops:
	// the reaper hands what it would have reaped to someone else (the
	// transport's own goroutines), so that nothing in flight waits for a
	// worker that is gone.
	Stop()
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
	wk.addReapers = append(wk.addReapers, r)
	wk.changed.Store(true)
	wk.mu.Unlock()
	r.Bind(wk.wake)
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
	w.reapers = append(w.reapers, w.addReapers...)
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
// their wake-ups; false as soon as one says no.
func (w *Worker) reapersSleep() bool {
	for _, r := range w.reapers {
		if !r.Sleep() {
			return false
		}
	}
	return true
}
