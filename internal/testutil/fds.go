// Package testutil holds what several packages' tests share: their
// TestMain (Main), which checks that the tests leak no goroutine and no
// descriptor; the listings of this process's descriptors it compares
// before and after the tests; Require and its kin, which skip a test that
// needs a machine feature this machine lacks (root, io_uring, network
// namespaces, mounts, eBPF, the tools make deps installs, etcd, an RDMA
// device), or fail it where the environment says the machine provides it
// (ProvidesEnv); Eventually, the one wait for a state another goroutine or
// process reaches, and Clock, the one fake clock; a small loop-mounted ext4
// file system for the tests of a full disk (MountSmallExt4); a run
// loop (a daemon's Run) kept going until the test ends (Run); and a
// daemon's cluster key file (KeyFile). The
// descriptors are read from /proc/self/fd; where they cannot be listed,
// the listings fail.
package testutil

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// FDs maps this process's open descriptors to what they refer to (the
// target of /proc/self/fd/N).
type FDs map[string]string

// OpenFDs lists this process's open descriptors. It fails when they cannot
// be listed: no /proc, or one that lists nothing (the listing itself holds
// a descriptor, so a real one is never empty).
func OpenFDs() (FDs, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("listing this process's descriptors: %w", err)
	}
	if len(ents) == 0 {
		return nil, errors.New("listing this process's descriptors: /proc/self/fd is empty")
	}
	out := make(FDs, len(ents))
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		out[e.Name()] = l
	}
	return out, nil
}

// Leaked lists, sorted, the descriptors open in now that were not open in
// before or refer to something else, as "fd N -> target", a socket
// followed by what the kernel's tables say of it (DescribeSocket). It leaves out
// /dev/null, which the testing package opens during m.Run, and the
// directory that was being listed (gone by the time it is read).
func (before FDs) Leaked(now FDs) []string {
	var out []string
	for fd, link := range now {
		if before[fd] != link && link != os.DevNull && link != "" {
			line := fmt.Sprintf("fd %s -> %s", fd, link)
			if d := DescribeSocket(link); d != "" {
				line += " (" + d + ")"
			}
			out = append(out, line)
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
	fds, err := OpenFDs()
	if err != nil {
		return nil, err
	}
	var out []string
	for fd, l := range fds {
		if strings.HasPrefix(l, "socket:") || strings.HasPrefix(l, "/memfd:") {
			out = append(out, fd+"="+l)
		}
	}
	slices.Sort(out)
	return out, nil
}
