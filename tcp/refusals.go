package tcp

import (
	"log/slog"
	"net"
	"sync"
	"time"
)

// refuseLogEvery is the least time between two log lines about peers
// refused for one reason; the lines in between are counted.
const refuseLogEvery = 10 * time.Second

// peerKeepAlive is the idle time before TCP keep-alive probes start on a
// peer connection; five probes a fifth of it apart follow, so a peer
// whose host vanished (no FIN, no RST) is found dead within about twice
// this, and its daemon id is free for its next run.
const peerKeepAlive = 10 * time.Second

// peerKeepAliveConfig is peerKeepAlive as the socket options of the
// connections this node dials and accepts.
var peerKeepAliveConfig = net.KeepAliveConfig{Enable: true, Idle: peerKeepAlive, Interval: peerKeepAlive / 5, Count: 5}

// refusalLog rate-limits the log of refused peers: per reason, the first
// refusal is logged at once, later ones at most once per refuseLogEvery
// with the count since the last line (flush reports what is left).
type refusalLog struct {
	// mu guards m.
	mu sync.Mutex
	m  map[string]*refusals
}

// refusals are the refusals for one reason since the last line.
type refusals struct {
	last    time.Time // when the last line was written
	count   int       // refusals not yet logged
	example []any     // the latest refusal's details
}

// maxRefusalReasons bounds the reasons tracked (reasons are fixed strings,
// so this is never reached in practice).
const maxRefusalReasons = 64

// note records one refusal and logs it unless a line for the same reason
// was written less than refuseLogEvery ago.
func (r *refusalLog) note(log *slog.Logger, reason string, now time.Time, kv ...any) {
	r.mu.Lock()
	if r.m == nil {
		r.m = make(map[string]*refusals)
	}
	e := r.m[reason]
	if e == nil {
		if len(r.m) >= maxRefusalReasons {
			r.mu.Unlock()
			return
		}
		e = &refusals{}
		r.m[reason] = e
	}
	e.count++
	e.example = kv
	if !e.last.IsZero() && now.Sub(e.last) < refuseLogEvery {
		r.mu.Unlock()
		return
	}
	count := e.count
	e.count, e.last, e.example = 0, now, nil
	r.mu.Unlock()
	log.Warn("refusing peer", append([]any{"reason", reason, "refused", count, "per", refuseLogEvery.String()}, kv...)...)
}

// flush logs the refusals counted but not yet logged whose reason's last
// line is refuseLogEvery old (the reaper calls it).
func (r *refusalLog) flush(log *slog.Logger, now time.Time) {
	r.mu.Lock()
	var lines [][]any
	for reason, e := range r.m {
		if e.count == 0 || now.Sub(e.last) < refuseLogEvery {
			continue
		}
		lines = append(lines, append([]any{"reason", reason, "refused", e.count, "per", refuseLogEvery.String()}, e.example...))
		e.count, e.last, e.example = 0, now, nil
	}
	r.mu.Unlock()
	for _, kv := range lines {
		log.Warn("refusing peer", kv...)
	}
}
