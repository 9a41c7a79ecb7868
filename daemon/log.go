package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/tensorcast/tensorcast/daemon/config"
)

// NewLogger builds the daemon's one logger from the config (log_format
// text or json, log_level); every package gets it (or a child of it)
// passed down. With journal set (see UnderJournal) the lines carry no time
// (the journal stamps each entry) and start with their syslog priority,
// "<7>" debug to "<3>" error, which journald takes as the entry's level
// and strips.
func NewLogger(c Config, w io.Writer, journal bool) *slog.Logger {
	lvl, err := config.ParseLevel(c.LogLevel)
	if err != nil {
		lvl = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if !journal {
		if c.LogFormat == "json" {
			return slog.New(slog.NewJSONHandler(w, opts))
		}
		return slog.New(slog.NewTextHandler(w, opts))
	}
	opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	pw := &prioWriter{w: w}
	var h slog.Handler
	if c.LogFormat == "json" {
		h = slog.NewJSONHandler(pw, opts)
	} else {
		h = slog.NewTextHandler(pw, opts)
	}
	return slog.New(&prioHandler{h: h, w: pw})
}

// UnderJournal reports whether f is connected to systemd's journal: systemd
// sets JOURNAL_STREAM to the device and inode of the stream it hands the
// service, which must be f's (not a file the output was redirected to).
func UnderJournal(getenv func(string) string, f *os.File) bool {
	js := getenv("JOURNAL_STREAM")
	dev, ino, ok := strings.Cut(js, ":")
	if !ok {
		return false
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return strconv.FormatUint(uint64(st.Dev), 10) == dev && strconv.FormatUint(st.Ino, 10) == ino
}

// prioWriter writes each record with the syslog priority prefix of the
// record being handled. The slog handlers write a record in one Write.
type prioWriter struct {
	w io.Writer
	// mu serializes records and guards prio.
	mu   sync.Mutex
	prio []byte
}

func (p *prioWriter) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append(p.prio[:len(p.prio):len(p.prio)], b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// prioHandler sets the writer's prefix for each record, under the writer's
// lock shared by every handler derived from it.
type prioHandler struct {
	h slog.Handler
	w *prioWriter
}

func syslogPrio(l slog.Level) []byte {
	switch {
	case l >= slog.LevelError:
		return []byte("<3>")
	case l >= slog.LevelWarn:
		return []byte("<4>")
	case l >= slog.LevelInfo:
		return []byte("<6>")
	}
	return []byte("<7>")
}

func (p *prioHandler) Enabled(ctx context.Context, l slog.Level) bool { return p.h.Enabled(ctx, l) }

func (p *prioHandler) Handle(ctx context.Context, r slog.Record) error {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	p.w.prio = syslogPrio(r.Level)
	return p.h.Handle(ctx, r)
}

func (p *prioHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &prioHandler{h: p.h.WithAttrs(as), w: p.w}
}

func (p *prioHandler) WithGroup(name string) slog.Handler {
	return &prioHandler{h: p.h.WithGroup(name), w: p.w}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
