package ratelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// TestFloodIsOneLineAndACount: the first event of a quiet period is logged
// at once with its detail, the ones within the interval are counted, and
// Stop logs the count with the last one's detail.
func TestFloodIsOneLineAndACount(t *testing.T) {
	// The interval never ends within the test, so every line is logged by
	// this goroutine: a plain buffer will do.
	var buf bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), slog.LevelWarn, "queue broken", time.Hour)
	for i := range 1000 {
		l.Event(slog.Int("queue", i))
	}
	if n := strings.Count(buf.String(), "queue broken"); n != 1 || !strings.Contains(buf.String(), "queue=0") {
		t.Fatalf("%d lines for 1000 events within the interval, want the first alone:\n%s", n, buf.String())
	}
	l.Stop()
	out := buf.String()
	if n := strings.Count(out, "queue broken"); n != 2 || !strings.Contains(out, "count=999") || !strings.Contains(out, "queue=999") {
		t.Fatalf("after Stop, want one more line with count=999 and the last event's detail:\n%s", out)
	}
	l.Event(slog.Int("queue", 1000))
	if strings.Count(buf.String(), "queue broken") != 2 {
		t.Fatal("an event after Stop was logged at once")
	}
}
