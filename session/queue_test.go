package session

import (
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

// TestSubmitGroup: the worker gives the stream at most groupBytes of
// small requests per Submit, so that an inline copy answers in small
// bursts; large reads in a row go in one Submit; a large write goes alone.
// Sizes are reads; a negative size is a write of that many bytes.
func TestSubmitGroup(t *testing.T) {
	reqs := func(sizes ...int64) []xfer.StreamRequest {
		out := make([]xfer.StreamRequest, len(sizes))
		for i, s := range sizes {
			out[i].Req.Op, out[i].Req.Length = xfer.OpRead, uint64(s)
			if s < 0 {
				out[i].Req.Op, out[i].Req.Length = xfer.OpWrite, uint64(-s)
			}
		}
		return out
	}
	many := func(n int, size int64) []int64 {
		s := make([]int64, n)
		for i := range s {
			s[i] = size
		}
		return s
	}
	for _, c := range []struct {
		name  string
		sizes []int64
		want  int
	}{
		{"16 x 64 KiB", many(16, 64<<10), 4},
		{"100 x 4 KiB", many(100, 4<<10), 64},
		{"under the bound", many(3, 4<<10), 3},
		{"one larger than the bound, then a small one", []int64{1 << 20, 4 << 10}, 1},
		{"large reads in a row go together", many(8, 1<<20), 8},
		{"a large write goes alone", many(8, -1<<20), 1},
		{"large reads stop before a large write", []int64{1 << 20, 1 << 20, -1 << 20, 1 << 20}, 2},
		{"small writes group like small reads", many(16, -64<<10), 4},
		{"small ones stop before a large one", []int64{4 << 10, 4 << 10, 1 << 20}, 2},
		{"small ones stop before a large write", []int64{-4 << 10, 4 << 10, -1 << 20}, 2},
		{"the bound exactly", many(2, 128<<10), 2},
		{"just past it", []int64{128 << 10, 128 << 10, 1}, 2},
		{"zero-length requests", many(5, 0), 5},
	} {
		if got := submitGroup(reqs(c.sizes...)); got != c.want {
			t.Errorf("%s: a group of %d, want %d", c.name, got, c.want)
		}
	}
}
