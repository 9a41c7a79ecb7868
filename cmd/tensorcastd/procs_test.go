package main

import "testing"

func TestProcs(t *testing.T) {
	cases := []struct {
		current int
		env     string
		want    int
	}{
		{2, "", 2 + spareProcs},
		{64, "", 64 + spareProcs},
		{2, "2", 2}, // set by the operator: kept
		{8, "8", 8},
	}
	for _, c := range cases {
		if got := procs(c.current, c.env); got != c.want {
			t.Errorf("procs(%d, %q) = %d, want %d", c.current, c.env, got, c.want)
		}
	}
}
