package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

func TestJournalLogger(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var b lockedBuffer
		c := Defaults()
		c.LogFormat = format
		log := NewLogger(c, &b, true).With("component", "test")
		log.Debug("hidden at info")
		log.Info("one", "k", 1)
		log.Warn("two")
		log.Error("three")
		lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: %d lines, want 3:\n%s", format, len(lines), b.String())
		}
		for i, prio := range []string{"<6>", "<4>", "<3>"} {
			l := lines[i]
			if !strings.HasPrefix(l, prio) {
				t.Errorf("%s: line %q lacks priority %s", format, l, prio)
			}
			if strings.Contains(l, "time") {
				t.Errorf("%s: line %q carries a time under the journal", format, l)
			}
			if !strings.Contains(l, "component") {
				t.Errorf("%s: line %q lost the logger's attributes", format, l)
			}
			if format == "json" && !json.Valid([]byte(strings.TrimPrefix(l, prio))) {
				t.Errorf("json: %q is not JSON after its prefix", l)
			}
		}
	}
	// Outside the journal: times, no prefixes.
	var b lockedBuffer
	NewLogger(Defaults(), &b, false).Info("plain")
	if s := b.String(); !strings.HasPrefix(s, "time=") || strings.HasPrefix(s, "<") {
		t.Fatalf("plain line %q", s)
	}
}

func TestUnderJournal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "stream")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	mine := fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	if !UnderJournal(env(map[string]string{"JOURNAL_STREAM": mine}), f) {
		t.Fatalf("JOURNAL_STREAM=%s names this file, not seen as the journal", mine)
	}
	for _, js := range []string{"", "junk", fmt.Sprintf("%d:%d", st.Dev, st.Ino+1)} {
		if UnderJournal(env(map[string]string{"JOURNAL_STREAM": js}), f) {
			t.Fatalf("JOURNAL_STREAM=%q taken for this file", js)
		}
	}
}

// auditRecords parses a JSON log and returns its audit records.
func auditRecords(t *testing.T, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["msg"] == "audit" {
			out = append(out, m)
		}
	}
	return out
}

// TestAuditOncePerMutatingCall: every mutating control call of a client
// is logged exactly once, with the audit keys it carried; read-only calls
// are not audited.
func TestAuditOncePerMutatingCall(t *testing.T) {
	cfg := testConfig(t.TempDir())
	var logBuf lockedBuffer
	lc := cfg
	lc.LogFormat, lc.LogLevel = "json", "debug"
	_, c := startClient(t, cfg, NewLogger(lc, &logBuf, false), "audit")
	pool, _ := c.Pool()
	n := 0
	keys := func(op string) []client.CallOption {
		n++
		return []client.CallOption{client.WithIdempotencyKey(fmt.Sprintf("key-%d-%s", n, op)),
			client.WithLane("lane-" + op), client.WithPolicyVersion(uint32(n))}
	}
	want := map[string]string{} // idempotency key -> op
	mark := func(op string) []client.CallOption {
		o := keys(op)
		want[fmt.Sprintf("key-%d-%s", n, op)] = op
		return o
	}
	buf, err := c.RegisterBuffer(1<<20, mark("RegisterBufferRequest")...)
	if err != nil {
		t.Fatal(err)
	}
	offs, err := c.AllocBlocks(nil, 2, 4096, mark("AllocBlocksRequest")...)
	if err != nil {
		t.Fatal(err)
	}
	bid, err := c.AllocBatch(4, mark("AllocBatchRequest")...)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []xfer.Request{{Op: xfer.OpWrite, Local: buf.ID, Target: pool.Segment, TargetOffset: offs[0], Length: 4096}}
	res := make([]error, 1)
	if err := c.Submit(bid, reqs, res, mark("SubmitRequest")...); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(bid, 5*time.Second, keys("read-only")...); err != nil {
		t.Fatal(err)
	}
	if err := c.FreeBatch(bid, mark("FreeBatchRequest")...); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Transfer(reqs, 5*time.Second, res, mark("TransferRequestBody")...); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.RegisterFile(filepath.Join(cfg.DataDir, "a.bin"), false, 1<<20, mark("RegisterFileRequest")...); err != nil {
		t.Logf("RegisterFile: %v (still audited)", err)
	}
	if err := c.FreeBlocks(offs, make([]error, len(offs)), mark("FreeBlocksRequest")...); err != nil {
		t.Fatal(err)
	}
	if err := c.UnregisterBuffer(buf.ID, mark("UnregisterBufferRequest")...); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stats(keys("read-only")...); err != nil {
		t.Fatal(err)
	}
	c.Close()

	seen := map[string]int{}
	for _, r := range auditRecords(t, logBuf.String()) {
		key, _ := r["idempotency_key"].(string)
		for _, k := range []string{"request_id", "idempotency_key", "lane", "policy_version", "op", "code"} {
			if _, ok := r[k]; !ok {
				t.Errorf("audit record without %s: %v", k, r)
			}
		}
		if op, ok := want[key]; ok {
			if r["op"] != op || r["lane"] != "lane-"+op {
				t.Errorf("audit record %v, want op %s lane lane-%s", r, op, op)
			}
		} else {
			t.Errorf("audit record for a call that is not mutating or not ours: %v", r)
		}
		seen[key]++
	}
	for key, op := range want {
		if seen[key] != 1 {
			t.Errorf("%s (%s) audited %d times, want once", op, key, seen[key])
		}
	}
	if t.Failed() {
		t.Logf("log:\n%s", logBuf.String())
	}
}

// TestNoLogPerRequestAtDefaultLevel: at the default level, a steady stream
// of data-path calls logs nothing.
func TestNoLogPerRequestAtDefaultLevel(t *testing.T) {
	cfg := testConfig(t.TempDir())
	var logBuf lockedBuffer
	_, c := startClient(t, cfg, NewLogger(cfg, &logBuf, false), "quiet")
	pool, _ := c.Pool()
	buf, offs := newBuffer(t, c, 1<<20), allocBlocks(t, c, 1, 64<<10)
	if _, err := c.Stats(); err != nil {
		t.Fatal(err)
	}
	// The daemon serves clients before it logs that it is ready: the
	// start-up lines are all out once that one is.
	testutil.Eventually(t, 10*time.Second, func() bool { return strings.Contains(logBuf.String(), "tensorcastd ready") },
		"the daemon's ready line")
	before := logBuf.String()
	reqs := []xfer.Request{{Op: xfer.OpWrite, Local: buf.ID, Target: pool.Segment, TargetOffset: offs[0], Length: 64 << 10}}
	res := make([]error, 1)
	for i := range 200 {
		if _, err := c.Transfer(reqs, 5*time.Second, res, client.WithIdempotencyKey(fmt.Sprint("t", i))); err != nil {
			t.Fatal(err)
		}
		bid, err := c.AllocBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Submit(bid, reqs, res); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Wait(bid, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if _, err := c.TaskStatus(bid, 0); err != nil {
			t.Fatal(err)
		}
		if err := c.FreeBatch(bid); err != nil {
			t.Fatal(err)
		}
	}
	if after := logBuf.String(); after != before {
		t.Fatalf("data-path calls logged at the default level:\n%s", strings.TrimPrefix(after, before))
	}
}
