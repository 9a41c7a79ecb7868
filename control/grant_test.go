package control

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/wire"
)

// newGrantEnv is a server with a store (L1 only), its handles and leases,
// and a mode.
func newGrantEnv(t *testing.T) *env {
	t.Helper()
	var s *store.Store
	var g *grant.Grants
	e := newEnv(t, false, func(c *Config, d *Deps) {
		var err error
		if s, err = store.New(store.Config{}, d.Pool.(*shm.Pool), nil); err != nil {
			t.Fatal(err)
		}
		h, err := grant.NewHandles(grant.HandlesConfig{DaemonID: c.DaemonID, Epoch: 5, Scope: DefaultTenant,
			Key: []byte("a test cluster's key"), Pinner: grant.StorePinner{Store: s}})
		if err != nil {
			t.Fatal(err)
		}
		l, err := grant.NewLeases(grant.LeasesConfig{Pinner: grant.StorePinner{Store: s}})
		if err != nil {
			t.Fatal(err)
		}
		g = &grant.Grants{Handles: h, Leases: l}
		if d.Admission, err = grant.NewAdmission(grant.BudgetedHybrid, nil, nil); err != nil {
			t.Fatal(err)
		}
		d.Store, d.Grants = s, g
	})
	t.Cleanup(func() { // before the env's own: the server, the grants, the store
		e.srv.Close()
		g.Close()
		s.Close()
	})
	return e
}

// putG0 stores the key g/0 through c, for the grant calls to pin.
func putG0(t *testing.T, c *rawClient) [][]byte {
	t.Helper()
	keys := [][]byte{[]byte("g/0")}
	buf := body[wire.AllocBlocksResponse](t, c.call(&wire.AllocBlocksRequest{N: 1, Size: 4096})).Offsets[0]
	expectCode(t, c.call(&wire.StorePutRequest{Keys: keys, Values: []wire.Extent{{Segment: testPoolID, Offset: buf, Length: 10}}}),
		tcproto.CodeOK)
	return keys
}

// The handle, lease and mode calls are audited at AuditLevel with the
// request's audit keys (a renewal, a keep-alive, one level below), what an
// issue granted is logged with its first key, and the calls are idempotent
// by key: a retried issue answers the first token and pins nothing again;
// the same key with other arguments is refused.
func TestGrantCallsAuditedAndIdempotent(t *testing.T) {
	e := newGrantEnv(t)
	c := dialRaw(t, e.sock)
	keys := putG0(t, c)

	ctx := wire.Context{IdempotencyKey: []byte("k-handle"), Lane: []byte("hybrid-cache-first"), PolicyVersion: 4}
	first := body[wire.HandleIssueResponse](t, c.callCtx(ctx, &wire.HandleIssueRequest{Keys: keys, TTLMS: 60000}))
	token := bytes.Clone(first.Token)
	again := body[wire.HandleIssueResponse](t, c.callCtx(ctx, &wire.HandleIssueRequest{Keys: keys, TTLMS: 60000}))
	if !bytes.Equal(again.Token, token) {
		t.Fatal("a retried issue answered another token")
	}
	expectCode(t, c.callCtx(ctx, &wire.HandleIssueRequest{Keys: keys, TTLMS: 1000}), tcproto.CodeFAILED_PRECONDITION)
	info := body[wire.StoreStatResponse](t, c.call(&wire.StoreStatRequest{Key: keys[0]}))
	if info.Info.Pins != 1 {
		t.Fatalf("%d pins after a retried issue, want 1", info.Info.Pins)
	}
	expectCode(t, c.callCtx(wire.Context{IdempotencyKey: []byte("k-lease")},
		&wire.LeaseCreateRequest{OpID: []byte("op"), Keys: keys, TTLMS: 60000}), tcproto.CodeOK)
	expectCode(t, c.callCtx(wire.Context{IdempotencyKey: []byte("k-release")}, &wire.HandleReleaseRequest{Token: token}),
		tcproto.CodeOK)
	expectCode(t, c.callCtx(wire.Context{IdempotencyKey: []byte("k-mode")}, &wire.ModeRequest{Set: "local-first"}),
		tcproto.CodeOK)
	m := body[wire.ModeResponse](t, c.call(&wire.ModeRequest{}))
	if m.Mode != "local-first" {
		t.Fatalf("mode %q after setting local-first", m.Mode)
	}

	renew := body[wire.HandleIssueResponse](t, c.call(&wire.HandleIssueRequest{Keys: keys, TTLMS: 60000})).Token
	expectCode(t, c.callCtx(wire.Context{IdempotencyKey: []byte("k-renew")}, &wire.HandleRenewRequest{Token: renew, TTLMS: 1000}),
		tcproto.CodeOK)
	if log := e.logBuf.String(); !strings.Contains(log, `msg="retention handle issued"`) || !strings.Contains(log, "first_key=g/0") {
		t.Errorf("no record of what the issue granted:\n%s", log)
	}

	want := map[string]bool{"k-handle": false, "k-lease": false, "k-release": false, "k-mode": false, "k-renew": false}
	for _, line := range strings.Split(e.logBuf.String(), "\n") {
		if !strings.Contains(line, "msg=audit") {
			continue
		}
		for k := range want {
			if strings.Contains(line, "idempotency_key="+k+" ") {
				want[k] = true
				level := "level=INFO"
				if k == "k-renew" {
					level = "level=DEBUG" // a keep-alive, audited with the data path
				}
				if !strings.Contains(line, level) {
					t.Errorf("%s not audited at %s: %s", k, level, line)
				}
			}
		}
		if strings.Contains(line, "idempotency_key=k-handle ") &&
			(!strings.Contains(line, "lane=hybrid-cache-first") || !strings.Contains(line, "policy_version=4")) {
			t.Errorf("the issue's audit record lacks its lane or policy version: %s", line)
		}
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("no audit record of %s:\n%s", k, e.logBuf.String())
		}
	}
}

// A handle belongs to the tenant's store, not to the connection that asked
// for it: an issue retried with its idempotency key on a new connection,
// after the first closed before the client read the answer, answers the
// first token and pins nothing again (the first handle would otherwise
// stay pinned until its TTL, its token lost). A lease's create and a
// release, retried so, answer as the first did too.
func TestGrantRetriedOnNewConnection(t *testing.T) {
	e := newGrantEnv(t)
	c := dialRaw(t, e.sock)
	keys := putG0(t, c)

	issue := wire.Context{IdempotencyKey: []byte("k-issue"), Lane: []byte("hybrid-cache-first")}
	lease := wire.Context{IdempotencyKey: []byte("k-lease"), Lane: []byte("hybrid-cache-first")}
	release := wire.Context{IdempotencyKey: []byte("k-release"), Lane: []byte("hybrid-cache-first")}
	first := bytes.Clone(body[wire.HandleIssueResponse](t, c.callCtx(issue, &wire.HandleIssueRequest{Keys: keys, TTLMS: 60000})).Token)
	expectCode(t, c.callCtx(lease, &wire.LeaseCreateRequest{OpID: []byte("op"), Keys: keys, TTLMS: 60000}), tcproto.CodeOK)
	other := bytes.Clone(body[wire.HandleIssueResponse](t, c.call(&wire.HandleIssueRequest{Keys: keys, TTLMS: 60000})).Token)
	expectCode(t, c.callCtx(release, &wire.HandleReleaseRequest{Token: other}), tcproto.CodeOK)
	c.uc.Close()
	testutil.Eventually(t, testTimeout, func() bool { return e.srv.Connections() == 0 }, "the first connection released")

	c2 := dialRaw(t, e.sock)
	again := body[wire.HandleIssueResponse](t, c2.callCtx(issue, &wire.HandleIssueRequest{Keys: keys, TTLMS: 60000}))
	if !bytes.Equal(again.Token, first) {
		t.Error("an issue retried on a new connection was issued again")
	}
	expectCode(t, c2.callCtx(lease, &wire.LeaseCreateRequest{OpID: []byte("op"), Keys: keys, TTLMS: 60000}), tcproto.CodeOK)
	expectCode(t, c2.callCtx(release, &wire.HandleReleaseRequest{Token: other}), tcproto.CodeOK)
	if pins := body[wire.StoreStatResponse](t, c2.call(&wire.StoreStatRequest{Key: keys[0]})).Info.Pins; pins != 2 {
		t.Fatalf("%d pins after the retries, want 2 (the first handle and the lease)", pins)
	}
}

// What each handle and lease call granted or gave back is recorded with
// the request's id beside its audit record: the handle's id, its issuer,
// the tenant and how many keys (an issue its first key too); a lease's
// operation id, the tenant and its keys. A release names the handle it
// released, not only the request that asked.
func TestGrantAuditNamesTheHandle(t *testing.T) {
	e := newGrantEnv(t)
	c := dialRaw(t, e.sock)
	keys := putG0(t, c)

	issued := body[wire.HandleIssueResponse](t, c.call(&wire.HandleIssueRequest{Keys: keys, TTLMS: 60000}))
	id := strconv.FormatUint(issued.HandleID, 10)
	renewed := body[wire.HandleRenewResponse](t, c.call(&wire.HandleRenewRequest{Token: bytes.Clone(issued.Token), TTLMS: 60000}))
	expectCode(t, c.call(&wire.HandleReleaseRequest{Token: bytes.Clone(renewed.Token)}), tcproto.CodeOK)
	expectCode(t, c.call(&wire.LeaseCreateRequest{OpID: []byte("op-7"), Keys: keys, TTLMS: 60000}), tcproto.CodeOK)
	expectCode(t, c.call(&wire.LeaseReleaseRequest{OpID: []byte("op-7")}), tcproto.CodeOK)

	handle := []string{"handle=" + id + " ", "issuer=test-daemon ", "tenant=" + DefaultTenant + " ", "keys=1 "}
	lease := []string{"op=op-7 ", "tenant=" + DefaultTenant + " ", "keys=1 "}
	for msg, want := range map[string][]string{
		`msg="retention handle issued"`:   append(handle, "first_key=g/0 "),
		`msg="retention handle renewed"`:  handle,
		`msg="retention handle released"`: handle,
		`msg="placement lease created"`:   append(lease, "first_key=g/0 "),
		`msg="placement lease released"`:  lease,
	} {
		var line string
		for _, l := range strings.Split(e.logBuf.String(), "\n") {
			if strings.Contains(l, msg+" ") {
				line = l + " "
			}
		}
		if line == "" {
			t.Errorf("no record %s:\n%s", msg, e.logBuf.String())
			continue
		}
		for _, w := range append(want, "request_id=") {
			if !strings.Contains(line, w) {
				t.Errorf("the record %s lacks %q: %s", msg, w, line)
			}
		}
	}
}
