package session

import (
	"log/slog"

	"github.com/tensorcast/tensorcast/internal/ratelog"
)

// warnings are the rate-limited logs of what a client can make its session
// warn about: a client that breaks queue after queue, or closes connection
// after connection with work in flight, gets a line per interval with a
// count, not a line per queue.
type warnings struct {
	brokenQueue, abandonedBatch, lingeringBlock, lingeringExport *ratelog.Log
	// faultedResults: a store call's results region faulted.
	faultedResults *ratelog.Log
}

// warns returns the host's warnings, made at the first use from Host.Log.
func (h *Host) warns() *warnings {
	h.warnOnce.Do(func() {
		log := h.Log
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		every := h.LogInterval
		h.warnings = &warnings{
			brokenQueue:     ratelog.New(log, slog.LevelWarn, "queue broken by the client: an index past its ring", every),
			abandonedBatch:  ratelog.New(log, slog.LevelWarn, "abandoning a busy batch of a closed connection", every),
			lingeringBlock:  ratelog.New(log, slog.LevelWarn, "pool block left to its in-flight transfers or peer requests; freed when they end", every),
			lingeringExport: ratelog.New(log, slog.LevelWarn, "peer requests still in an unexported range", every),
			faultedResults: ratelog.New(log, slog.LevelWarn,
				"store call failed: its results region faulted (the client shrank its unsealed buffer)", every),
		}
	})
	return h.warnings
}

// StopLogs logs what the rate-limited warnings still count and stops their
// timers. The server calls it once its sessions are closed.
func (h *Host) StopLogs() {
	w := h.warns()
	for _, l := range []*ratelog.Log{w.brokenQueue, w.abandonedBatch, w.lingeringBlock, w.lingeringExport, w.faultedResults} {
		l.Stop()
	}
}

// who are the attributes that say which session a warning is about.
func (c *Session) who() []slog.Attr {
	return []slog.Attr{slog.Uint64("conn", c.id), slog.String("tenant", c.tenant)}
}

// faultedResults warns that call's results could not be written.
func (c *Session) faultedResults(call *storeCall) {
	c.h.warns().faultedResults.Event(append(c.who(), slog.Uint64("segment", uint64(call.buf.ID())),
		slog.Int("keys", call.n))...)
}
