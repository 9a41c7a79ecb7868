package reactor

import (
	"time"

	"github.com/tensorcast/tensorcast/uring"
)

// DefaultPoll is Config.Poll's default: about one client's turn-around
// (a futex wake-up of its thread, its reap and its next submission) on
// the machines the daemon was measured on, where a worker's own wake-up
// from its ring costs 10-50 µs.
const DefaultPoll = 50 * time.Microsecond

// MaxPoll bounds Config.Poll.
const MaxPoll = time.Millisecond

// pollMisses is how many polls in a row may end with nothing before the
// worker stops polling: a client that thinks between its batches, or
// sends none, costs the worker at most that many polls, then one in
// pollProbe of its idle turns while it stays so.
const (
	pollMisses = 2
	pollProbe  = 16
)

// pollWindow and pollShare bound what polls cost whatever the clients do:
// within each pollWindow a worker polls for at most pollShare of it, then
// sleeps at every idle turn until the next window. A client that submits
// a little before each poll would run out (a no-op every 40 µs, say) would
// otherwise keep its worker polling on a whole core, taken from the other
// threads of the host (the transports' among them); bounded, it costs at
// most half a core, and then a wake-up per submission, as with no poll.
const (
	pollWindow = 10 * time.Millisecond
	pollShare  = pollWindow / 2
)

// poller is a worker's poll before it sleeps (owned by its thread).
//
// The turn it covers: a worker that answers a queue's last request in
// flight (a local copy, a batch's last file write) and goes to sleep
// makes the client's next batch wait for its wake-up, a doorbell the
// client rings and the ring's wait ending, besides the client's own
// wake-up: with a batch's requests all in the daemon at once, both sides
// then idle in turn. Polling for the client's next submission for a
// bounded time instead, with nothing else of the worker's in flight, ends
// that turn when the next batch comes within it; its requests then also
// reach the worker without a doorbell (the client sees no NEED_WAKEUP).
// A poll starts only after a pass that did work and left every queue of
// the worker with nothing in flight (Queue.Idle) and the ring with nothing
// of its own (uring.Waits.Poll): requests in flight end with a completion
// that wakes the worker anyway, and polling through them would spin for
// their whole duration. After pollMisses polls in a row that found
// nothing, the worker polls only one idle turn in pollProbe, until a poll
// finds work again. Polls take at most pollShare of each pollWindow.
type poller struct {
	limit  time.Duration    // how long a poll lasts; 0 never
	now    func() time.Time // the clock (time.Now; a test's own)
	start  time.Time        // the poll under way started; zero none
	last   time.Time        // the pass under way began (read only while a poll is under way)
	worked bool             // the last pass did work
	misses uint8            // polls in a row that ended with nothing
	skips  uint8            // idle turns without a poll since the last probe
	// window is when the current pollWindow began; spent is how long
	// the polls of it took so far.
	window time.Time
	spent  time.Duration
}

// passing records that a pass begins: the end of a poll under way, if
// the pass finds work.
func (p *poller) passing() {
	if !p.start.IsZero() {
		p.last = p.now()
	}
}

// served records a pass: one that did work ends a poll under way, found.
// The poll ended where that pass began (passing): the pass's own work (a
// local batch's copies, hundreds of microseconds) is not polling, and
// counted as such it would spend pollShare on work and put the worker to
// sleep at every idle turn for the rest of the window.
func (p *poller) served(did bool) {
	if !did {
		return
	}
	p.worked = true
	if !p.start.IsZero() {
		p.stop(p.last)
		p.misses, p.skips = 0, 0
	}
}

// stop ends the poll under way at now, counting its time.
func (p *poller) stop(now time.Time) {
	p.spent += now.Sub(p.start)
	p.start = time.Time{}
}

// allowed reports whether a poll may start at now: its window's share is
// not spent.
func (p *poller) allowed(now time.Time) bool {
	if now.Sub(p.window) >= pollWindow {
		p.window, p.spent = now, 0
	}
	return p.spent < pollShare
}

// poll reports whether the worker polls once more instead of sleeping.
func (w *Worker) poll(ws uring.Waits) bool {
	p := &w.poller
	if p.limit <= 0 {
		return false
	}
	if !p.start.IsZero() {
		now := p.now()
		if now.Sub(p.start) < p.limit && ws.Poll() {
			return true
		}
		p.stop(now)
		p.worked = false
		p.misses = min(p.misses+1, pollMisses)
		w.pollMisses.Add(1)
		return false
	}
	if !p.worked {
		return false
	}
	p.worked = false
	if p.misses >= pollMisses {
		if p.skips++; p.skips < pollProbe {
			return false
		}
		p.skips = 0
	}
	for _, s := range w.queues {
		if !s.q.Idle() {
			return false
		}
	}
	now := p.now()
	if !p.allowed(now) {
		w.pollsCapped.Add(1)
		return false
	}
	if !ws.Poll() {
		return false
	}
	p.start = now
	w.polls.Add(1)
	return true
}
