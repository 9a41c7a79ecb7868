package testutil

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

// outcome records how a check ended a test: skipped, failed, or neither.
type outcome struct {
	testing.TB
	skipped, failed string
}

func (o *outcome) Helper() {}

func (o *outcome) Skipf(format string, args ...any) {
	o.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (o *outcome) Fatalf(format string, args ...any) {
	o.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (o *outcome) Fatal(args ...any) { o.Fatalf("%s", fmt.Sprint(args...)) }

// check runs f as a test body on its own goroutine, as the testing package
// does, so that a skip or a failure ends f there.
func check(f func(testing.TB)) *outcome {
	o := new(outcome)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(o)
	}()
	<-done
	return o
}

// TestMissingSkipsUnlessProvided: a missing feature skips, naming it and
// why, on a machine that does not claim it, and fails on one whose
// environment lists it; a misspelt name in the list fails every check.
func TestMissingSkipsUnlessProvided(t *testing.T) {
	missing := func(tb testing.TB) { Missing(tb, IOUring, "io_uring_setup: %v", "ENOSYS") }
	for _, tc := range []struct {
		provides       string
		skips, failsOn string
	}{
		{"", "needs io_uring: io_uring_setup: ENOSYS", ""},
		{"root,netns", "needs io_uring", ""},
		{"root, io_uring ,etcd", "", "provides io_uring, but it is missing: io_uring_setup: ENOSYS"},
		{"root,io-uring", "", `names "io-uring"`},
	} {
		t.Setenv(ProvidesEnv, tc.provides)
		o := check(missing)
		if tc.skips != "" && (o.failed != "" || !strings.Contains(o.skipped, tc.skips)) {
			t.Errorf("%s=%q: skipped %q, failed %q; want a skip saying %q", ProvidesEnv, tc.provides, o.skipped, o.failed, tc.skips)
		}
		if tc.failsOn != "" && (o.skipped != "" || !strings.Contains(o.failed, tc.failsOn)) {
			t.Errorf("%s=%q: skipped %q, failed %q; want a failure saying %q", ProvidesEnv, tc.provides, o.skipped, o.failed, tc.failsOn)
		}
	}
}

// TestRequireSupported: only a "not supported" probe error counts as a
// missing feature; any other error is the test's failure wherever it runs.
func TestRequireSupported(t *testing.T) {
	t.Setenv(ProvidesEnv, "")
	if o := check(func(tb testing.TB) { RequireSupported(tb, IOUring, nil) }); o.skipped != "" || o.failed != "" {
		t.Errorf("a probe that worked ended the test: %+v", o)
	}
	notSupported := fmt.Errorf("uring: %w: io_uring_setup: operation not permitted", xfer.ErrNotSupported)
	if o := check(func(tb testing.TB) { RequireSupported(tb, IOUring, notSupported) }); !strings.Contains(o.skipped, "operation not permitted") {
		t.Errorf("not supported: skipped %q, failed %q; want a skip with the probe's error", o.skipped, o.failed)
	}
	broken := errors.New("uring: mmap of the SQ ring: cannot allocate memory")
	if o := check(func(tb testing.TB) { RequireSupported(tb, IOUring, broken) }); o.skipped != "" || !strings.Contains(o.failed, "cannot allocate memory") {
		t.Errorf("another error: skipped %q, failed %q; want a failure", o.skipped, o.failed)
	}
	t.Setenv(ProvidesEnv, "io_uring")
	if o := check(func(tb testing.TB) { RequireSupported(tb, IOUring, notSupported) }); !strings.Contains(o.failed, "missing") {
		t.Errorf("not supported where provided: skipped %q, failed %q; want a failure", o.skipped, o.failed)
	}
}

// TestRequireRDMA: the RDMA device is RXE_DEV; without it the test skips,
// or fails where the environment says the machine provides rdma.
func TestRequireRDMA(t *testing.T) {
	t.Setenv("RXE_DEV", "")
	t.Setenv(ProvidesEnv, "")
	if o := check(func(tb testing.TB) { Require(tb, RDMA) }); !strings.Contains(o.skipped, "RXE_DEV is unset") {
		t.Errorf("no device: skipped %q, failed %q; want a skip naming RXE_DEV", o.skipped, o.failed)
	}
	t.Setenv(ProvidesEnv, "rdma")
	if o := check(func(tb testing.TB) { Require(tb, RDMA) }); o.failed == "" {
		t.Errorf("no device where provided: skipped %q; want a failure", o.skipped)
	}
	t.Setenv("RXE_DEV", "rxe0")
	if o := check(func(tb testing.TB) { Require(tb, RDMA) }); o.skipped != "" || o.failed != "" {
		t.Errorf("with a device: %+v", o)
	}
}
