package daemon

import (
	"fmt"
	"io"
	"log/slog"
)

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("bad log level %q", s)
	}
	return l, nil
}

// NewLogger builds the daemon's one logger from the config; every package
// gets it (or a child of it) passed down.
func NewLogger(c Config, w io.Writer) *slog.Logger {
	lvl, err := parseLevel(c.LogLevel)
	if err != nil {
		lvl = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
