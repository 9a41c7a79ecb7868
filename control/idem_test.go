package control

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/wire"
)

// TestSharedIdem: a key is bound daemon wide to the lane and arguments of
// its first use; its answer is replayed only to the connection that got
// it; another connection is refused while that one lives and runs afresh
// once it closed; keys expire and a connection's records stay bounded.
func TestSharedIdem(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	tab := newSharedIdem(3, 3, time.Minute, clock)
	k, stream, catalog := []byte("k1"), []byte("stream-first"), []byte("catalog-first")
	const h, conn1, conn2 = 77, 1, 2

	if v, _, _ := tab.check("", k, stream, h, conn1); v != idemRun {
		t.Fatalf("new key: %v", v)
	}
	tab.record("", k, stream, h, conn1, []byte("answer-1"), false)
	v, frame, _ := tab.check("", k, stream, h, conn1)
	if v != idemReplay || string(frame) != "answer-1" {
		t.Fatalf("same connection retry: %v %q", v, frame)
	}
	for _, c := range []struct {
		name       string
		lane       []byte
		hash, conn uint64
		want       string
	}{
		{"other lane, same connection", catalog, h + 1, conn1, `bound to lane "stream-first"`},
		{"other lane, other connection", catalog, h + 1, conn2, `bound to lane "stream-first"`},
		{"other arguments", stream, h + 2, conn2, "other arguments"},
		{"same call, other live connection", stream, h, conn2, "in use by connection 1"},
	} {
		v, _, err := tab.check("", k, c.lane, c.hash, c.conn)
		if v != idemRefuse || !errors.Is(err, ErrIdempotencyConflict) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v %v, want a refusal saying %q", c.name, v, err, c.want)
		}
	}
	tab.closed(conn1)
	if r := tab.m[scoped("", k)]; r.frame != nil || !r.connGone {
		t.Fatalf("after its connection closed the record keeps its answer (%q) or its owner (gone %v)", r.frame, r.connGone)
	}
	if v, _, _ := tab.check("", k, stream, h, conn2); v != idemRun {
		t.Fatalf("same call after the owner closed: %v, want a fresh run", v)
	}
	if v, _, err := tab.check("", k, catalog, h+1, conn2); v != idemRefuse {
		t.Fatalf("other lane after the owner closed: %v %v, want refused (the key keeps its lane)", v, err)
	}
	tab.record("", k, stream, h, conn2, []byte("answer-2"), false)
	if v, frame, _ := tab.check("", k, stream, h, conn2); v != idemReplay || string(frame) != "answer-2" {
		t.Fatalf("rerun's answer: %v %q", v, frame)
	}

	// Expiry.
	now = now.Add(time.Minute)
	if v, _, _ := tab.check("", k, catalog, h+1, conn2); v != idemRun {
		t.Fatalf("expired key: %v, want run", v)
	}
	// Bound: the connection's oldest goes first.
	for i := range 5 {
		tab.record("", []byte(fmt.Sprint("b", i)), stream, uint64(i), conn2, nil, false)
	}
	if n := tab.len(); n != 3 {
		t.Fatalf("table holds %d keys, limit 3", n)
	}
	if v, _, _ := tab.check("", []byte("b0"), catalog, 0, conn2); v != idemRun {
		t.Fatal("the oldest key was not evicted")
	}
	if v, _, _ := tab.check("", []byte("b4"), catalog, 4, conn2); v != idemRefuse {
		t.Fatal("the newest key was evicted")
	}
	// Keys that expire and come back leave no stale slot behind that
	// would evict them early.
	tab2 := newSharedIdem(2, 2, time.Second, clock)
	for range 100 {
		tab2.record("", []byte("x"), stream, 1, conn1, nil, false)
		now = now.Add(2 * time.Second)
		tab2.check("", []byte("x"), stream, 1, conn1) // expires it
	}
	tab2.record("", []byte("x"), stream, 1, conn1, nil, false)
	tab2.record("", []byte("y"), stream, 1, conn1, nil, false)
	if v, _, _ := tab2.check("", []byte("x"), stream, 1, conn1); v != idemReplay {
		t.Fatal("a stale slot evicted a live key")
	}
	if n := len(tab2.conns[conn1].slots); n > 2*2+16+1 {
		t.Fatalf("the connection's order grew to %d slots", n)
	}
}

// TestSharedIdemConnIndex: a connection's close touches only its own keys,
// and the order of a long-lived connection whose keys were evicted stays
// bounded by the live ones.
func TestSharedIdemConnIndex(t *testing.T) {
	tab := newSharedIdem(100, 100, time.Hour, nil)
	lane := []byte("stream-first")
	for i := range 10000 {
		tab.record("", []byte(fmt.Sprint("a", i)), lane, 1, 5, []byte("answer"), false)
	}
	tab.record("", []byte("b"), lane, 1, 6, []byte("other"), false)
	if n := len(tab.conns[5].slots); n > 2*100+16 {
		t.Fatalf("connection 5's order holds %d slots; at most 100 are live", n)
	}
	tab.closed(5)
	if _, ok := tab.conns[5]; ok {
		t.Fatal("the closed connection's order is kept")
	}
	if r := tab.m[scoped("", []byte("b"))]; r.connGone || string(r.frame) != "other" {
		t.Fatalf("another connection's record changed by a close: %+v", r)
	}
	gone := 0
	for _, r := range tab.m {
		if r.conn == 5 && r.connGone && r.frame == nil {
			gone++
		}
	}
	if gone != 100 {
		t.Fatalf("%d of connection 5's 100 live keys marked closed", gone)
	}
}

// TestSharedIdemBoundsPerOwner: no owner's records push out another's. A
// tenant whose connections record keys past every bound, and close, and
// another connection of the victim's own tenant doing the same, evict only
// their own records: the victim's key of a live connection is still
// refused on another connection, its key of a closed one still bound to
// its lane, and the table holds no more than its bounds.
func TestSharedIdemBoundsPerOwner(t *testing.T) {
	const limit = 4
	tab := newSharedIdem(limit, limit, time.Hour, nil)
	stream, catalog := []byte("stream-first"), []byte("catalog-first")
	const h = 7
	tab.record("b", []byte("live"), stream, h, 1, []byte("answer"), false)
	tab.record("b", []byte("bound"), stream, h, 2, []byte("answer"), false)
	tab.closed(2)

	for conn := uint64(10); conn < 20; conn++ { // tenant a: connections past their limit, closed
		for i := range 2 * limit {
			tab.record("a", fmt.Appendf(nil, "a-%d-%d", conn, i), stream, h, conn, nil, false)
		}
		tab.closed(conn)
	}
	for i := range 10 * limit { // tenant b's own third connection, open
		tab.record("b", fmt.Appendf(nil, "b-%d", i), stream, h, 3, nil, false)
	}

	if v, _, err := tab.check("b", []byte("live"), stream, h, 4); v != idemRefuse {
		t.Errorf("key of b's live connection on another: %v %v, want refused", v, err)
	}
	if v, _, err := tab.check("b", []byte("bound"), catalog, h, 4); v != idemRefuse {
		t.Errorf("key of b's closed connection in another lane: %v %v, want refused (bound)", v, err)
	}
	if v, _, _ := tab.check("a", []byte("a-19-7"), catalog, h, 4); v != idemRefuse {
		t.Error("tenant a's newest key is forgotten")
	}
	if v, _, _ := tab.check("a", []byte("a-19-3"), catalog, h, 4); v != idemRun {
		t.Error("tenant a's keys past its key space's bound are kept")
	}
	// Connection 1's key, connection 3's limit, a's closed connections'
	// limit, b's closed connection's key.
	if n, want := tab.len(), 1+limit+limit+1; n != want {
		t.Fatalf("table holds %d keys, want %d", n, want)
	}
}

// TestIdempotencyKeysPerTenant: idempotency keys are per tenant. A key
// tenant a used (bound to its lane) means nothing to tenant b, which can
// neither probe it nor be blocked by it; within a tenant it is bound as
// before.
func TestIdempotencyKeysPerTenant(t *testing.T) {
	e, _ := tenantEnv(t)
	bin := openToAll(t, e)
	run := func(uid uint32, lane string) string {
		return runAs(t, e, bin, "idem", uid, uid, nil, "TC_KEY=shared-key", "TC_LANE="+lane)
	}
	if got := run(uidA, "lane-a"); got != "status OK" {
		t.Fatalf("tenant a's first use of its key: %q", got)
	}
	if got := run(uidB, "lane-b"); got != "status OK" {
		t.Fatalf("tenant b using the key tenant a bound to another lane: %q, want OK (its own key)", got)
	}
	if got := run(uidA, "lane-b"); got != "status "+tcproto.CodeFAILED_PRECONDITION.String() {
		t.Fatalf("tenant a's key in another lane: %q, want FAILED_PRECONDITION (still bound)", got)
	}
}

// TestReplayOfAnAnswerToRequestIDZero: an answer recorded for a keyed call
// sent under request id 0 carries no request id field (0 is its default),
// so the field cannot be set in place; a retry under another id still gets
// the answer under its own id.
func TestReplayOfAnAnswerToRequestIDZero(t *testing.T) {
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	ctx := wire.Context{IdempotencyKey: []byte("alloc-0"), Lane: []byte("stream-first")}
	c.req.Ctx, c.req.Body = ctx, &wire.AllocBlocksRequest{N: 2, Size: 4096}
	if err := c.send(wire.EncodeRequest(c.b, &c.req)); err != nil {
		t.Fatal(err)
	}
	r, _, err := c.recv()
	if err != nil {
		t.Fatal(err)
	}
	expectCode(t, r, tcproto.CodeOK)
	if r.RequestID != 0 {
		t.Fatalf("answer to request 0 carries id %d", r.RequestID)
	}
	first := slices.Clone(body[wire.AllocBlocksResponse](t, r).Offsets)

	// exchange fails the test unless the answer carries the retry's id.
	r = c.callCtx(ctx, &wire.AllocBlocksRequest{N: 2, Size: 4096})
	expectCode(t, r, tcproto.CodeOK)
	if got := body[wire.AllocBlocksResponse](t, r).Offsets; !slices.Equal(got, first) {
		t.Fatalf("retry got %v, first %v", got, first)
	}
	if n := e.pool.Stats().Blocks; n != 2 {
		t.Fatalf("retry allocated again: %d blocks", n)
	}
}

// TestIdempotencyFloodKeepsOtherConnectionsKeys: a connection that sends
// keyed calls past its limit forgets only its own oldest keys. Another
// connection's key stays bound, so that the same call presented on a third
// connection while the first lives is refused instead of running twice.
func TestIdempotencyFloodKeepsOtherConnectionsKeys(t *testing.T) {
	const keys = 8
	e := newEnv(t, false, func(c *Config, _ *Deps) {
		c.MaxConns, c.MaxConnsPerUID, c.Limits.MaxIdempotencyKeys = 4, 4, keys
	})
	first, flood, retry := dialRaw(t, e.sock), dialRaw(t, e.sock), dialRaw(t, e.sock)
	alloc := wire.Context{IdempotencyKey: []byte("alloc-once"), Lane: []byte("stream-first")}
	expectCode(t, first.callCtx(alloc, &wire.AllocBlocksRequest{N: 1, Size: 4096}), tcproto.CodeOK)
	for i := range 8 * keys { // past the daemon-wide bound, MaxConns×keys
		expectCode(t, flood.callCtx(wire.Context{IdempotencyKey: fmt.Appendf(nil, "flood-%d", i)}, &wire.FreeBlocksRequest{}),
			tcproto.CodeOK)
	}
	expectCode(t, retry.callCtx(alloc, &wire.AllocBlocksRequest{N: 1, Size: 4096}), tcproto.CodeFAILED_PRECONDITION)
	if n := e.pool.Stats().Blocks; n != 1 {
		t.Fatalf("%d pool blocks: the call ran again on another connection while the first lives", n)
	}
}

// TestIdempotencyFloodKeepsOtherTenantsKeys: a tenant whose clients send
// keyed calls past every bound (several connections, each past its limit,
// then closed) forgets only its own keys. Another tenant's key in use by a
// live connection is still refused on another of its connections, and its
// key of a closed connection is still bound to its lane.
func TestIdempotencyFloodKeepsOtherTenantsKeys(t *testing.T) {
	const keys = 8
	e, poolB := tenantEnv(t, func(c *Config, d *Deps) {
		c.MaxConns, c.MaxConnsPerUID, c.Limits.MaxIdempotencyKeys = 4, 4, keys
		d.Tenants[1].UIDs = append(d.Tenants[1].UIDs, uint32(os.Getuid())) // this test's connections are b's
	})
	bin := openToAll(t, e)
	conns := func(n int) {
		t.Helper()
		testutil.Eventually(t, testTimeout, func() bool { return e.srv.Connections() == n },
			"%d connections served (%d)", n, testutil.Lazy(e.srv.Connections))
	}
	held, closing := dialRaw(t, e.sock), dialRaw(t, e.sock)
	alloc := wire.Context{IdempotencyKey: []byte("alloc-once"), Lane: []byte("stream-first")}
	expectCode(t, held.callCtx(alloc, &wire.AllocBlocksRequest{N: 1, Size: 4096}), tcproto.CodeOK)
	bound := wire.Context{IdempotencyKey: []byte("bound"), Lane: []byte("stream-first")}
	expectCode(t, closing.callCtx(bound, &wire.FreeBlocksRequest{}), tcproto.CodeOK)
	closing.uc.Close()
	conns(1)

	// Tenant a: 3 connections × 4·keys keys, 12 times the daemon-wide bound.
	if got := runAs(t, e, bin, "idem-flood", uidA, uidA, nil, "TC_CONNS=3", fmt.Sprint("TC_N=", 4*keys)); got != "flooded" {
		t.Fatalf("tenant a's flood: %q", got)
	}
	conns(1)

	retry := dialRaw(t, e.sock)
	expectCode(t, retry.callCtx(alloc, &wire.AllocBlocksRequest{N: 1, Size: 4096}), tcproto.CodeFAILED_PRECONDITION)
	if n := poolB.Stats().Blocks; n != 1 {
		t.Fatalf("%d of tenant b's pool blocks: the call ran again on another connection while the first lives", n)
	}
	other := bound
	other.Lane = []byte("catalog-first")
	expectCode(t, retry.callCtx(other, &wire.FreeBlocksRequest{}), tcproto.CodeFAILED_PRECONDITION)
}

// TestIdempotencyKeysForgottenAreCounted: a connection's keys past its
// limit are forgotten (its oldest first); each one is counted in its
// Stats and the daemon warns, so that a retry of a forgotten key running
// again is not silent.
func TestIdempotencyKeysForgottenAreCounted(t *testing.T) {
	const keys, over = 8, 3
	e := newEnv(t, false, func(c *Config, _ *Deps) { c.Limits.MaxIdempotencyKeys = keys })
	c := dialRaw(t, e.sock)
	for i := range keys + over {
		expectCode(t, c.callCtx(wire.Context{IdempotencyKey: fmt.Appendf(nil, "k-%d", i)}, &wire.FreeBlocksRequest{}), tcproto.CodeOK)
	}
	st := body[wire.StatsResponse](t, c.call(&wire.StatsRequest{}))
	for name, want := range map[string]uint64{"idempotency_keys": keys, "idempotency_keys_forgotten": over} {
		i := slices.IndexFunc(st.Connection, func(k wire.Counter) bool { return k.Name == name })
		if i < 0 || st.Connection[i].Value != want {
			t.Errorf("connection counter %s: %v, want %d", name, st.Connection, want)
		}
	}
	if log := e.logBuf.String(); !strings.Contains(log, "idempotency keys forgotten") || !strings.Contains(log, "max_idempotency_keys=8") {
		t.Errorf("no warning of the forgotten keys:\n%s", log)
	}
}

// TestIdempotencyRefusalsRateLimited: a client that keeps presenting a key
// another live connection holds is refused each time, and the daemon's
// log says so once and then counts, not a line per call: the calls may
// be data-path ones, which log nothing per request at the default level.
func TestIdempotencyRefusalsRateLimited(t *testing.T) {
	e := newEnv(t, false, func(c *Config, _ *Deps) { c.LogInterval = time.Hour }) // the count comes with Close
	owner, other := dialRaw(t, e.sock), dialRaw(t, e.sock)
	alloc := wire.Context{IdempotencyKey: []byte("alloc-once")}
	expectCode(t, owner.callCtx(alloc, &wire.AllocBlocksRequest{N: 1, Size: 4096}), tcproto.CodeOK)
	const flood = 50
	for range flood {
		expectCode(t, other.callCtx(alloc, &wire.AllocBlocksRequest{N: 1, Size: 4096}), tcproto.CodeFAILED_PRECONDITION)
	}
	if n := strings.Count(e.logBuf.String(), "idempotency key refused"); n != 1 {
		t.Fatalf("%d log lines for %d refusals, want 1 until the interval ends:\n%s", n, flood, e.logBuf.String())
	}
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if log := e.logBuf.String(); !strings.Contains(log, fmt.Sprintf("count=%d", flood-1)) {
		t.Fatalf("the refusals after the first are not counted when the log flushes:\n%s", log)
	}
}
