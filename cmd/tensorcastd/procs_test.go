package main

import (
	"testing"

	"github.com/tensorcast/tensorcast/daemon"
	"github.com/tensorcast/tensorcast/tcp"
)

func TestProcs(t *testing.T) {
	cases := []struct {
		current int
		env     string
		blocked int
		want    int
	}{
		{2, "", 2, 4},
		{2, "", 6, 8},
		{64, "", 3, 67},
		{2, "2", 6, 2}, // set by the operator: kept
		{8, "8", 0, 8},
	}
	for _, c := range cases {
		if got := procs(c.current, c.env, c.blocked); got != c.want {
			t.Errorf("procs(%d, %q, %d) = %d, want %d", c.current, c.env, c.blocked, got, c.want)
		}
	}
}

// TestSyscallLoops checks the count main adds: one per reactor worker, and
// the tcp node's event loops only with a peer plane.
func TestSyscallLoops(t *testing.T) {
	cfg := daemon.Config{DataWorkers: 3}
	if got := daemon.SyscallLoops(cfg); got != 3 {
		t.Errorf("3 workers, no peer plane: %d sleepers, want 3", got)
	}
	cfg.PeerListen = "127.0.0.1:0"
	if got, want := daemon.SyscallLoops(cfg), 3+tcp.EventLoops(); got != want {
		t.Errorf("3 workers and a peer plane: %d sleepers, want %d", got, want)
	}
}
