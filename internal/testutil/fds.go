// Package testutil holds what several packages' tests share: the listings
// of this process's descriptors that their TestMains' leak checks compare
// before and after the tests, a small loop-mounted ext4 file system for
// the tests of a full disk (MountSmallExt4), and a run loop (a daemon's
// Run) kept going until the test ends (Run). The descriptors are read
// from /proc/self/fd; where there is none, the listings fail or come back
// empty.
package testutil

import (
	"fmt"
	"os"
	"slices"
	"strings"
)

// FDs maps this process's open descriptors to what they refer to (the
// target of /proc/self/fd/N).
type FDs map[string]string

// OpenFDs lists this process's open descriptors; it is empty when they
// cannot be listed.
func OpenFDs() FDs {
	out := FDs{}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return out
	}
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		out[e.Name()] = l
	}
	return out
}

// Leaked lists, sorted, the descriptors open now that were not open in
// before or refer to something else, as "fd N -> target". It leaves out
// /dev/null, which the testing package opens during m.Run, and the
// directory being listed.
func (before FDs) Leaked() []string {
	var out []string
	for fd, link := range OpenFDs() {
		if before[fd] != link && link != os.DevNull && link != "" {
			out = append(out, fmt.Sprintf("fd %s -> %s", fd, link))
		}
	}
	slices.Sort(out)
	return out
}

// WarmFDs makes the runtime open the descriptors it keeps for the life of
// the process (the network poller's epoll and eventfd), so that a baseline
// taken after it does not count them as the tests' leak.
func WarmFDs() {
	if r, w, err := os.Pipe(); err == nil {
		r.Close()
		w.Close()
	}
}

// HandleFDs lists this process's open sockets and memfds, as "N=target":
// the handles that servers and clients under test open (the test runtime's
// own pipes and files are left out).
func HandleFDs() ([]string, error) {
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
