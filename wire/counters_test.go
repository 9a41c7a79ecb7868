package wire

import (
	"slices"
	"testing"
)

func TestSnake(t *testing.T) {
	for in, want := range map[string]string{"BatchesLive": "batches_live", "FreeBytes": "free_bytes", "IOInFlight": "io_in_flight",
		"Size": "size", "L2Keys": "l2_keys", "MTU": "mtu"} {
		if got := snake(in); got != want {
			t.Errorf("snake(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAppendCounters: every exported number of a stats struct, nested and
// repeated ones with dotted names, bools as 0/1, ratios in ppm, negative
// values and unexported fields left out, after what dst held.
func TestAppendCounters(t *testing.T) {
	type class struct{ BlockSize, Live uint64 }
	type stats struct {
		Size          uint64
		Waiting       int64
		Behind        int
		Hugepages     bool
		Fragmentation float64
		Classes       []class
		hidden        uint64
	}
	got := AppendCounters([]Counter{{Name: "before", Value: 9}}, stats{Size: 64, Waiting: 3, Behind: -1, Hugepages: true,
		Fragmentation: 0.25, Classes: []class{{4096, 2}, {8192, 0}}, hidden: 7})
	want := []Counter{{"before", 9}, {"size", 64}, {"waiting", 3}, {"hugepages", 1}, {"fragmentation_ppm", 250000},
		{"classes.0.block_size", 4096}, {"classes.0.live", 2}, {"classes.1.block_size", 8192}, {"classes.1.live", 0}}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}
