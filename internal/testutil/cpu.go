//go:build unix

package testutil

import (
	"syscall"
	"time"
)

// ProcessCPU is this process's CPU time so far, user and system (0 when
// getrusage fails), for benchmarks that report CPU per request beside
// their rate.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
