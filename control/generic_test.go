package control

import (
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
)

// TestFailuresAnswerGenericMessages: a call that fails answers its code and
// the code's generic text, never the error behind it (paths, limits, ids,
// the daemon's own wording); the detail goes to the daemon's log.
func TestFailuresAnswerGenericMessages(t *testing.T) {
	e := newEnv(t, false, func(c *Config, d *Deps) {
		c.Limits.MaxBatches = 1
		d.FileOpener = opener{opened: make(chan *fileSeg, 1)}
	})
	c := dialRaw(t, e.sock)
	expectCode(t, c.call(&wire.AllocBatchRequest{Capacity: 1}), tcproto.CodeOK)
	for _, tc := range []struct {
		body   wire.RequestBody
		code   Code
		detail string // in the log, not in the answer
	}{
		{&wire.AllocBatchRequest{Capacity: 1}, tcproto.CodeRESOURCE_EXHAUSTED, "1 batches held"},
		{&wire.RegisterFileRequest{Path: []byte("/secret/path/kv.bin")}, tcproto.CodeNOT_FOUND, "file does not exist"},
		{&wire.FreeBatchRequest{Batch: 0xdeadbeef}, tcproto.CodeNOT_FOUND, "batch 3735928559"},
		{&wire.AllocBlocksRequest{N: 0, Size: 4096}, tcproto.CodeINVALID_ARGUMENT, "0 blocks of 4096 bytes"},
	} {
		r := c.call(tc.body)
		expectCode(t, r, tc.code)
		if got, want := string(r.Message), wire.StatusText(tc.code); got != want {
			t.Errorf("%s: the client read %q, want the generic %q", tc.body.Kind(), got, want)
		}
		if !strings.Contains(e.logBuf.String(), tc.detail) {
			t.Errorf("%s: the log does not say %q", tc.body.Kind(), tc.detail)
		}
	}
}
