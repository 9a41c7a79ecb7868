package testutil

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

// ProvidesEnv names the environment variable that says which machine
// features a test machine provides, comma-separated (CI sets it in
// .ci/run, the Soft-RoCE VM adds rdma):
//
//	TENSORCAST_TEST_PROVIDES=root,io_uring,netns,mount,bpf,tools,etcd,pty,hugepages,thp
//
// A test that needs a feature the machine lacks skips, saying what is
// missing, unless the variable lists that feature: then it fails, so that
// a machine meant to run it cannot quietly skip it.
const ProvidesEnv = "TENSORCAST_TEST_PROVIDES"

// A Feature is something a test needs from the machine it runs on.
type Feature string

// The features tests need. Each is named in ProvidesEnv by its value.
const (
	// Root: uid 0, for setuid helpers, other users and sysctls.
	Root Feature = "root"
	// IOUring: io_uring with the opcodes the uring transport needs.
	IOUring Feature = "io_uring"
	// Netns: network namespaces made with ip netns (root and iproute2).
	Netns Feature = "netns"
	// Mount: file systems the tests mount (tmpfs, ramfs, and ext4 images
	// on loop devices): root, e2fsprogs, util-linux and a free loop
	// device.
	Mount Feature = "mount"
	// BPF: loading and running eBPF programs (root, for CAP_BPF and
	// CAP_PERFMON, and a kernel with BTF and the hooks the views attach
	// to).
	BPF Feature = "bpf"
	// Tools: the commands of the Debian packages make deps installs for
	// the tests and benchmarks (promtool, systemd-analyze, tmux, fio,
	// iperf3, perftest), each found with Command.
	Tools Feature = "tools"
	// Etcd: the etcd server binary (Debian package etcd-server).
	Etcd Feature = "etcd"
	// RDMA: an RDMA device, named by RXE_DEV (the Soft-RoCE VM that make
	// test-rdma boots).
	RDMA Feature = "rdma"
	// Hugepages: 2 MiB hugepages the kernel supports and root can
	// reserve (vm.nr_hugepages) with free memory behind them.
	Hugepages Feature = "hugepages"
	// PTY: pseudo-terminals (/dev/ptmx).
	PTY Feature = "pty"
	// THP: transparent huge pages for memfds by MADV_COLLAPSE (Linux 6.1
	// and later, shmem_enabled not "deny", and free 2 MiB of memory).
	THP Feature = "thp"
)

var features = []Feature{Root, IOUring, Netns, Mount, BPF, Tools, Etcd, RDMA, Hugepages, PTY, THP}

// Require skips t when the machine lacks f, or fails it when ProvidesEnv
// lists f. It checks f itself for Root, Netns, Mount and BPF (root and the
// tools; a mount or a program load that then fails is Missing too) and
// RDMA; a test with a probe of its own for f calls RequireSupported or
// Missing instead.
func Require(t testing.TB, f Feature) {
	t.Helper()
	switch f {
	case Root:
		if os.Geteuid() != 0 {
			Missing(t, f, "not running as uid 0")
		}
	case Netns:
		if os.Geteuid() != 0 {
			Missing(t, f, "not running as uid 0, which ip netns add needs")
		}
		if _, err := exec.LookPath("ip"); err != nil {
			Missing(t, f, "no ip command (iproute2)")
		}
	case Mount:
		if os.Geteuid() != 0 {
			Missing(t, f, "not running as uid 0, which mount and losetup need")
		}
		for _, tool := range []string{"mkfs.ext4", "losetup", "truncate"} {
			if _, err := exec.LookPath(tool); err != nil {
				Missing(t, f, "%s not installed (packages e2fsprogs, util-linux, coreutils)", tool)
			}
		}
	case BPF:
		if os.Geteuid() != 0 {
			Missing(t, f, "not running as uid 0 (CAP_BPF and CAP_PERFMON)")
		}
	case RDMA:
		if os.Getenv("RXE_DEV") == "" {
			Missing(t, f, "RXE_DEV is unset (make test-rdma runs this in the Soft-RoCE VM)")
		}
	default:
		t.Fatalf("testutil.Require: %s has no check of its own; use RequireSupported or Missing", f)
	}
}

// Command finds the command name, which Debian's package pkg installs
// (make deps installs it), and returns its path; without it, it skips t or
// fails it where ProvidesEnv lists Tools.
func Command(t testing.TB, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Missing(t, Tools, "%s not installed (Debian package %s; make deps installs it)", name, pkg)
	}
	return path
}

// RequireSupported takes the error of a probe for f: nil passes; an error
// that says f is not supported here (xfer.ErrNotSupported) skips t or,
// when ProvidesEnv lists f, fails it; any other error fails t.
func RequireSupported(t testing.TB, f Feature, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if !errors.Is(err, xfer.ErrNotSupported) {
		t.Fatalf("probing %s: %v", f, err)
	}
	Missing(t, f, "%v", err)
}

// Missing is for a test that found f missing: it skips t, saying what is
// missing (format and args), or fails t when ProvidesEnv lists f.
func Missing(t testing.TB, f Feature, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	provided, err := Provided()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(provided, f) {
		t.Fatalf("%s=%s says this machine provides %s, but it is missing: %s", ProvidesEnv, os.Getenv(ProvidesEnv), f, why)
	}
	t.Skipf("skipped: needs %s: %s (%s does not list it)", f, why, ProvidesEnv)
}

// Provided lists the features ProvidesEnv names; a name that is no Feature
// is an error, so that a misspelt one cannot turn a failure back into a
// skip.
func Provided() ([]Feature, error) {
	var out []Feature
	for _, s := range strings.Split(os.Getenv(ProvidesEnv), ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !slices.Contains(features, Feature(s)) {
			return nil, fmt.Errorf("%s names %q, which is none of %v", ProvidesEnv, s, features)
		}
		out = append(out, Feature(s))
	}
	return out, nil
}
