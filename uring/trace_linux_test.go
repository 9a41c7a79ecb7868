package uring

import "testing"

// TestTraceEveryMarksSQEs: with TraceEvery 1 every data SQE carries
// TracedUserData and its completion still finds its slot; with 16 about
// one in 16 does; with 0 none.
func TestTraceEveryMarksSQEs(t *testing.T) {
	for _, tc := range []struct {
		every    int
		min, max uint64 // traced SQEs of 1600
	}{{1, 1600, 1600}, {16, 50, 200}, {0, 0, 0}} {
		tr := integrity(t, Config{TraceEvery: tc.every}, false, false, 800)
		st := tr.Stats()[0]
		if st.Submitted != 1600 || st.Traced < tc.min || st.Traced > tc.max {
			t.Errorf("TraceEvery %d: %d of %d SQEs traced, want %d..%d", tc.every, st.Traced, st.Submitted, tc.min, tc.max)
		}
	}
}
