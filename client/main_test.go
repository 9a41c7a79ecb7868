package client

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func TestMain(m *testing.M) {
	before, err := testutil.HandleFDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "listing fds:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		// codes_test.go links package tcp, whose gnet starts ants' pool
		// goroutines at init.
		if err := goleak.Find(
			goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
			goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	if code == 0 {
		if after, err := testutil.HandleFDs(); err == nil && len(after) > len(before) {
			fmt.Fprintf(os.Stderr, "fd leak: sockets and memfds before %v, after %v\n", before, after)
			code = 1
		}
	}
	os.Exit(code)
}

// mappings counts this process's shared mappings of memfds.
func mappings(t testing.TB) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "/memfd:")
}
