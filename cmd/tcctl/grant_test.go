package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
)

// startGrantDaemon is startStoreDaemon with the store's handles and
// leases, and a mode.
func startGrantDaemon(t *testing.T) string {
	t.Helper()
	return startStoreDaemon(t, func(d *control.Deps, s *store.Store) {
		h, err := grant.NewHandles(grant.HandlesConfig{DaemonID: "host-a", Epoch: 3, Key: []byte("a test cluster's key"),
			Pinner: grant.StorePinner{Store: s}})
		if err != nil {
			t.Fatal(err)
		}
		l, err := grant.NewLeases(grant.LeasesConfig{Pinner: grant.StorePinner{Store: s}})
		if err != nil {
			t.Fatal(err)
		}
		d.Grants = &grant.Grants{Handles: h, Leases: l}
		t.Cleanup(d.Grants.Close) // before the store's
		if d.Admission, err = grant.NewAdmission(grant.BudgetedHybrid, nil, nil); err != nil {
			t.Fatal(err)
		}
	})
}

// TestGrantCommands: handle issue/renew/release, lease create/release and
// mode show/set, each exiting 0 only on success and printing the status
// code's name otherwise.
func TestGrantCommands(t *testing.T) {
	sock := startGrantDaemon(t)
	run := tcctlOn(t, sock)
	stdin = strings.NewReader("value")
	run(0, "put", "k1", "-")
	stdin = strings.NewReader("value")
	run(0, "put", "k2", "-")

	tokenRE := regexp.MustCompile(`(?m)^token: +([0-9a-f]+)$`)
	out, _ := run(0, "handle", "issue", "--ttl", "30s", "k1", "k2")
	m := tokenRE.FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "handle:  1\n") {
		t.Fatalf("handle issue printed %q", out)
	}
	if out, _ := run(0, "stat", "k1"); !strings.Contains(out, "pins") || !regexp.MustCompile(`pins:? +1\b`).MatchString(out) {
		t.Fatalf("stat of a held key: %q", out)
	}
	if _, errs := run(1, "handle", "issue", "absent"); !strings.Contains(errs, "NOT_FOUND") {
		t.Fatalf("handle on an absent key: %q", errs)
	}
	out, _ = run(0, "handle", "renew", "--ttl", "1m", m[1])
	renewed := tokenRE.FindStringSubmatch(out)
	if renewed == nil || renewed[1] == m[1] {
		t.Fatalf("handle renew printed %q", out)
	}
	forged := []byte(renewed[1])
	if last := &forged[len(forged)-1]; *last == '0' { // another hex digit: the MAC's last byte changes
		*last = '1'
	} else {
		*last = '0'
	}
	if _, errs := run(1, "handle", "release", string(forged)); !strings.Contains(errs, "PERMISSION_DENIED") {
		t.Fatalf("release of a forged token: %q", errs)
	}
	run(0, "handle", "release", renewed[1])
	if _, errs := run(1, "handle", "release", renewed[1]); !strings.Contains(errs, "PERMISSION_DENIED") {
		t.Fatalf("second release: %q", errs)
	}
	run(2, "handle", "release", "not-hex")
	run(2, "handle", "issue")
	run(2, "handle", "frob")

	if out, _ := run(0, "lease", "create", "op-1", "k1", "k2"); !strings.Contains(out, "op-1 created") {
		t.Fatalf("lease create printed %q", out)
	}
	if out, _ := run(0, "lease", "create", "op-1", "k1", "k2"); !strings.Contains(out, "op-1 joined") {
		t.Fatalf("retried lease create printed %q", out)
	}
	if _, errs := run(1, "lease", "create", "op-1", "k1"); !strings.Contains(errs, "FAILED_PRECONDITION") {
		t.Fatalf("same op, other keys: %q", errs)
	}
	run(0, "lease", "release", "op-1")
	if _, errs := run(1, "lease", "release", "op-2"); !strings.Contains(errs, "NOT_FOUND") {
		t.Fatalf("release of an unknown op: %q", errs)
	}
	run(2, "lease", "create", "op-only")

	if out, _ := run(0, "mode"); !strings.Contains(out, "budgeted-hybrid") {
		t.Fatalf("mode printed %q", out)
	}
	if out, _ := run(0, "mode", "set", "local-first"); !strings.Contains(out, "local-first") || !strings.Contains(out, "unbounded") {
		t.Fatalf("mode set printed %q", out)
	}
	if _, errs := run(1, "mode", "set", "fast"); !strings.Contains(errs, "INVALID_ARGUMENT") {
		t.Fatalf("unknown mode: %q", errs)
	}
	run(2, "mode", "set")
}
