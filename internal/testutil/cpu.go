//go:build unix

package testutil

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
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

// ProcCPU is process pid's CPU time so far, user and system of all its
// threads, from /proc/PID/stat, for benchmarks that count another
// process's CPU (a daemon's) beside their rate. Its unit, USER_HZ, is 100
// on every Linux architecture Go supports; TENSORCAST_BENCH_CLK_TCK
// overrides it. tb fails when the file cannot be read.
func ProcCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		tb.Fatal(err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // from field 3, the state
	var ticks uint64
	for _, x := range f[11:13] { // utime, stime
		n, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			tb.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	tck := 100.0
	if v, err := strconv.ParseFloat(os.Getenv("TENSORCAST_BENCH_CLK_TCK"), 64); err == nil && v > 0 {
		tck = v
	}
	return time.Duration(float64(ticks) / tck * float64(time.Second))
}
