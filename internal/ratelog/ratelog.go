// Package ratelog logs a kind of event at most once per interval, with a
// count of what it did not log: a flood of events that someone outside the
// daemon can trigger (refused connections, bad frames, broken queues) is a
// line every interval, not a line per event.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Interval is how often a kind of event is logged at most by default: the
// first one at once, then one line per interval with the count.
const Interval = 10 * time.Second

// Log logs one kind of event at most once per interval: the first
// event of a quiet period at once, with its detail; the ones that follow
// within the interval are counted, and a timer logs their count (and the
// detail of the last) when the interval ends. A flood of refusals is so a
// line every interval, not a line per refusal.
//
// The timer is the only goroutine it starts; Stop cancels it and logs what
// is still counted.
type Log struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	every time.Duration

	// mu guards the fields below.
	mu      sync.Mutex
	n       int         // events counted since the last line
	last    []slog.Attr // the detail of the last counted event
	timer   *time.Timer // pending flush, nil when the period is quiet
	stopped bool
}

// New returns a Log of msg at level, at most a line per every (Interval
// when every is 0).
func New(log *slog.Logger, level slog.Level, msg string, every time.Duration) *Log {
	if every <= 0 {
		every = Interval
	}
	return &Log{log: log, level: level, msg: msg, every: every}
}

// Event records one event with its detail.
func (r *Log) Event(attrs ...slog.Attr) {
	r.mu.Lock()
	if r.timer != nil || r.stopped {
		r.n++
		r.last = attrs
		r.mu.Unlock()
		return
	}
	r.timer = time.AfterFunc(r.every, r.flush)
	r.mu.Unlock()
	r.log.LogAttrs(context.Background(), r.level, r.msg, attrs...)
}

// flush logs the events counted in the interval that ended; with none, the
// quiet period starts again.
func (r *Log) flush() {
	r.mu.Lock()
	n, last := r.n, r.last
	r.n, r.last = 0, nil
	if n == 0 || r.stopped {
		r.timer = nil
	} else {
		r.timer = time.AfterFunc(r.every, r.flush)
	}
	r.mu.Unlock()
	if n > 0 {
		r.log.LogAttrs(context.Background(), r.level, r.msg,
			append([]slog.Attr{slog.Int("count", n), slog.String("interval", r.every.String())}, last...)...)
	}
}

// Stop cancels the timer and logs what is still counted.
func (r *Log) Stop() {
	r.mu.Lock()
	r.stopped = true
	t := r.timer
	r.timer = nil
	n, last := r.n, r.last
	r.n, r.last = 0, nil
	r.mu.Unlock()
	if t != nil {
		t.Stop()
	}
	if n > 0 {
		r.log.LogAttrs(context.Background(), r.level, r.msg,
			append([]slog.Attr{slog.Int("count", n), slog.String("interval", r.every.String())}, last...)...)
	}
}
