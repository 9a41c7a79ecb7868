//go:build linux

package shm

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Let the runtime open its own fds (the netpoller's epoll and eventfd)
	// before taking the baseline.
	if f, err := os.CreateTemp("", "shm-fdwarm"); err == nil {
		_ = os.Remove(f.Name())
		_ = f.Close()
	}
	before, err := fdCount()
	if err != nil {
		fmt.Fprintln(os.Stderr, "counting fds:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if after, err := fdCount(); err != nil || after != before {
			fmt.Fprintf(os.Stderr, "fd leak: %d open fds before the tests, %d after (%v)\n", before, after, err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fdCount counts this process's open fds.
func fdCount() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	return len(ents), nil
}
