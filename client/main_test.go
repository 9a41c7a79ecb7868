package client

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	before, err := handleFDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "listing fds:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	if code == 0 {
		if after, err := handleFDs(); err == nil && len(after) > len(before) {
			fmt.Fprintf(os.Stderr, "fd leak: sockets and memfds before %v, after %v\n", before, after)
			code = 1
		}
	}
	os.Exit(code)
}

// handleFDs lists this process's open sockets and memfds.
func handleFDs() ([]string, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && (strings.HasPrefix(l, "socket:") || strings.HasPrefix(l, "/memfd:")) {
			out = append(out, e.Name()+"="+l)
		}
	}
	return out, nil
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
