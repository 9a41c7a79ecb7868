package peer

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// clientBuf is a client buffer as the table sees it, counting references.
func clientBuf(id xfer.SegmentID, size int) *xfertest.Segment {
	return xfertest.SegmentOf(id, xfer.KindClient, make([]byte, size))
}

// catalog records what it is told.
type catalog struct {
	mu     sync.Mutex // guards events
	events []string
}

func (c *catalog) Exported(name string, size uint64, rights uint8) {
	c.mu.Lock()
	c.events = append(c.events, fmt.Sprintf("+%s:%d:%d", name, size, rights))
	c.mu.Unlock()
}

func (c *catalog) Unexported(name string) {
	c.mu.Lock()
	c.events = append(c.events, "-"+name)
	c.mu.Unlock()
}

func (c *catalog) got() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// lookup, granted and deliver are what a peer request of tenant's own
// client does: Resolve, then the export's range, rights or notification.
func lookup(x *Exports, tenant, name string) (xfer.MemSegment, error) {
	e, err := x.Resolve(tenant, "", name)
	if err != nil {
		return nil, err
	}
	return e.Segment(), nil
}

func granted(x *Exports, tenant, name string) (uint8, bool) {
	e, err := x.Resolve(tenant, "", name)
	if err != nil {
		return 0, false
	}
	return e.Rights(), true
}

func deliver(x *Exports, tenant, name string, payload []byte) error {
	e, err := x.Resolve(tenant, "", name)
	if err != nil {
		return err
	}
	return e.Deliver(payload)
}

func TestNames(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{{"kv", true}, {strings.Repeat("x", MaxSegmentName), true}, {"", false}, {"a/b", false},
		{strings.Repeat("x", MaxSegmentName+1), false}} {
		if err := CheckName(c.name); (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("CheckName(%q) = %v", c.name, err)
		}
	}
	for r, ok := range map[uint8]bool{0: false, 1: true, 2: true, 3: true, 4: false, 7: false} {
		if ValidRights(r) != ok {
			t.Errorf("ValidRights(%d) = %v", r, !ok)
		}
	}
	for _, c := range []struct{ in, peer, owner, seg string }{
		{"d2/kv", "d2", "", "kv"}, {"d2/a/b", "d2", "a", "b"}, {"nopeer", "", "", ""}, {"/kv", "", "", ""}, {"d2/", "", "", ""},
		{"d2/a/", "", "", ""}, {"d2//b", "", "", ""}, {"d2/a/b/c", "", "", ""}, {"d2/a b/c", "", "", ""},
		{"d2/" + strings.Repeat("t", MaxTenant+1) + "/kv", "", "", ""},
		{strings.Repeat("p", MaxPeerID+1) + "/kv", "", "", ""}, {"d2/" + strings.Repeat("s", MaxSegmentName+1), "", "", ""},
	} {
		p, o, s, err := SplitRemote(c.in)
		if p != c.peer || o != c.owner || s != c.seg || (err != nil) != (c.peer == "") || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("SplitRemote(%q) = %q, %q, %q, %v", c.in, p, o, s, err)
		}
	}
}

// TestExportTable: what Export refuses, what a peer's lookup and List
// answer, the catalog's view (of the default tenant's exports), and a
// range that peers reach exactly.
func TestExportTable(t *testing.T) {
	cat := &catalog{}
	x := NewExports(cat)
	buf := clientBuf(5, 1<<16)
	for i := range buf.Bytes() {
		buf.Bytes()[i] = byte(i)
	}
	e, err := x.Export("kv", DefaultTenant, buf, 4096, 8192, wire.RightRead|wire.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	if e.Name() != "kv" || e.Source() != 5 || e.Size() != 8192 || e.Rights() != 3 {
		t.Fatalf("export: %q %d %d %d", e.Name(), e.Source(), e.Size(), e.Rights())
	}
	for _, c := range []struct {
		name      string
		off, n    uint64
		rights    uint8
		want      error
		wantWords string
	}{
		{"kv", 0, 1, wire.RightRead, xfer.ErrExists, "exported already"},
		{"a/b", 0, 1, wire.RightRead, ErrInvalid, "name"},
		{"r0", 0, 1, 0, ErrInvalid, "rights"},
		{"big", 0, 1<<16 + 1, wire.RightRead, ErrInvalid, "outside"},
		{"wrap", 1 << 63, 1 << 63, wire.RightRead, ErrInvalid, "outside"},
		{"none", 0, 0, wire.RightRead, ErrInvalid, "outside"},
	} {
		if _, err := x.Export(c.name, DefaultTenant, buf, c.off, c.n, c.rights); !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.wantWords) {
			t.Errorf("Export(%q, %d, %d, %d) = %v, want %v", c.name, c.off, c.n, c.rights, err, c.want)
		}
	}
	v, err := lookup(x, DefaultTenant, "kv")
	if err != nil || v.Size() != 8192 || len(v.Bytes()) != 8192 || v.Bytes()[0] != byte(4096%256) || v.ID() != 5 {
		t.Fatalf("Lookup: %v, %v", v, err)
	}
	if _, err := lookup(x, DefaultTenant, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lookup of an unknown name: %v", err)
	}
	if r, ok := granted(x, DefaultTenant, "kv"); !ok || r != 3 {
		t.Fatalf("Granted: %d, %v", r, ok)
	}
	if _, ok := granted(x, DefaultTenant, "nope"); ok {
		t.Fatal("Granted of an unknown name")
	}
	if !e.Overlaps(5, 0, 4097) || e.Overlaps(5, 0, 4096) || e.Overlaps(5, 12288, 1) || !e.Overlaps(5, 12287, 1) || e.Overlaps(6, 4096, 1) {
		t.Fatal("Overlaps is wrong about [4096, 12288) of segment 5")
	}
	if _, err := x.Export("ro", DefaultTenant, buf, 0, 4096, wire.RightRead); err != nil {
		t.Fatal(err)
	}
	if l := x.List(nil, "t2"); len(l) != 0 {
		t.Fatalf("List for another tenant: %+v", l)
	}
	l := x.List(nil, "")
	slices.SortFunc(l, func(a, b wire.SegmentInfo) int { return strings.Compare(string(a.Name), string(b.Name)) })
	if len(l) != 2 || string(l[0].Name) != "kv" || l[0].Size != 8192 || l[0].Rights != 3 || l[0].Segment != 5 || string(l[1].Name) != "ro" {
		t.Fatalf("List: %+v", l)
	}
	if !e.End(0) {
		t.Fatal("End with no peer request reported some still in the range")
	}
	if _, err := lookup(x, DefaultTenant, "kv"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lookup after End: %v", err)
	}
	if v.Acquire() {
		t.Fatal("the ended export's range still takes references")
	}
	if !e.End(0) {
		t.Fatal("a second End")
	}
	// The name is free again.
	if _, err := x.Export("kv", DefaultTenant, buf, 0, 4096, wire.RightRead); err != nil {
		t.Fatal(err)
	}
	if got := cat.got(); !slices.Equal(got, []string{"+kv:8192:3", "+ro:4096:1", "-kv", "+kv:4096:1"}) {
		t.Fatalf("catalog heard %v", got)
	}
	if buf.Refs() != 0 {
		t.Fatalf("%d references left on the buffer", buf.Refs())
	}
}

// TestEndWaitsForPeerRequests: ending an export takes its name at once and
// refuses new references, then waits for the peer request that holds its
// range, and only then runs what OnEnd registered (the RDMA plane's
// revocation) and returns. In a synctest bubble: End is seen blocked until
// the release, and time does not move while it waits.
func TestEndWaitsForPeerRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := NewExports(nil)
		buf := clientBuf(1, 4096)
		e, err := x.Export("kv", "", buf, 0, 4096, wire.RightWrite)
		if err != nil {
			t.Fatal(err)
		}
		seg := e.Segment()
		if !seg.Acquire() {
			t.Fatal("Acquire of a live export")
		}
		var mu sync.Mutex // guards events
		var events []string
		note := func(s string) {
			mu.Lock()
			events = append(events, s)
			mu.Unlock()
		}
		if !e.OnEnd(func() { note("revoked") }) {
			t.Fatal("OnEnd on a live export")
		}
		start := time.Now()
		done := make(chan bool, 1)
		go func() { done <- e.End(time.Hour) }()
		synctest.Wait() // End is durably blocked, or it returned
		select {
		case <-done:
			t.Fatal("End returned while a peer request held the range")
		default:
		}
		if _, err := lookup(x, "", "kv"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Lookup while End waits: %v", err)
		}
		if seg.Acquire() {
			t.Fatal("a new reference was taken while End waits")
		}
		if !e.Busy() {
			t.Fatal("not Busy while a peer request holds the range")
		}
		if e.OnEnd(func() { note("late") }) {
			t.Fatal("OnEnd accepted while the export ends")
		}
		note("released")
		seg.Release()
		if !<-done {
			t.Fatal("End reported the peer request still in the range after it ended")
		}
		mu.Lock()
		got := slices.Clone(events)
		mu.Unlock()
		if !slices.Equal(got, []string{"released", "revoked"}) {
			t.Fatalf("events %v, want the release before the revocation", got)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("End took %v of the bubble's clock: it polled instead of waiting for the release", d)
		}
		if e.Busy() || buf.Refs() != 0 {
			t.Fatalf("after the release: busy %v, %d references on the buffer", e.Busy(), buf.Refs())
		}
	})
}

// TestEndGivesUp: a peer request that outlives End's wait leaves the range
// Busy (its owner must not reuse it) until it ends; End returns at its
// limit, not before.
func TestEndGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := NewExports(nil)
		e, err := x.Export("blk", "", clientBuf(1, 4096), 0, 4096, wire.RightWrite)
		if err != nil {
			t.Fatal(err)
		}
		seg := e.Segment()
		seg.Acquire()
		revoked := false
		e.OnEnd(func() { revoked = true })
		start := time.Now()
		if e.End(time.Second) {
			t.Fatal("End reported the range free while a reference is held")
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("End gave up after %v, want its 1s limit", d)
		}
		if !revoked || !e.Busy() {
			t.Fatalf("after giving up: revoked %v, busy %v", revoked, e.Busy())
		}
		seg.Release()
		if e.Busy() {
			t.Fatal("still busy after the last reference went")
		}
		if !e.End(0) {
			t.Fatal("a later End still sees the range held")
		}
	})
}

// TestOnDrained: what OnDrained registers runs when the last peer request
// in an ended export's range lets go, however long after End gave up
// waiting, and not before; registered once nothing holds the range, it
// runs at once. Each runs once.
func TestOnDrained(t *testing.T) {
	x := NewExports(nil)
	e, err := x.Export("blk", "", clientBuf(1, 4096), 0, 4096, wire.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	seg := e.Segment()
	seg.Acquire()
	seg.Acquire()
	var mu sync.Mutex // guards ran
	ran := map[string]int{}
	note := func(s string) func() {
		return func() {
			mu.Lock()
			ran[s]++
			mu.Unlock()
		}
	}
	runs := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(ran)
	}
	e.OnDrained(note("before End"))
	if e.End(0) {
		t.Fatal("End reported the range free while references are held")
	}
	e.OnDrained(note("after End"))
	seg.Release()
	if got := runs(); len(got) != 0 {
		t.Fatalf("ran %v while a peer request still holds the range", got)
	}
	seg.Release()
	if got, want := runs(), map[string]int{"before End": 1, "after End": 1}; !maps.Equal(got, want) {
		t.Fatalf("ran %v once the last peer request let go, want %v", got, want)
	}
	e.OnDrained(note("drained"))
	if got, want := runs(), map[string]int{"before End": 1, "after End": 1, "drained": 1}; !maps.Equal(got, want) {
		t.Fatalf("ran %v after registering on a drained export, want %v", got, want)
	}
}

// TestInboxWakesOnDelivery: a Wait sleeps until a notification is queued
// and returns at that instant (the bubble's clock does not move: it is
// woken, it does not poll); without one it returns false at its deadline.
func TestInboxWakesOnDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := NewExports(nil)
		if _, err := x.Export("kv", "t", clientBuf(1, 64), 0, 64, wire.RightWrite); err != nil {
			t.Fatal(err)
		}
		in := NewInbox("connection 1", 8)
		if err := x.Subscribe("kv", "t", in); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		woke := make(chan bool, 1)
		go func() { woke <- in.Wait(start.Add(time.Hour), nil) }()
		synctest.Wait()
		select {
		case <-woke:
			t.Fatal("Wait returned with nothing queued")
		default:
		}
		if err := deliver(x, "t", "kv", []byte("ready")); err != nil {
			t.Fatal(err)
		}
		if !<-woke {
			t.Fatal("Wait did not report the delivery")
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("woken after %v of the bubble's clock, want at once", d)
		}
		if got := in.Take(nil, 10, 1<<20); len(got) != 1 || string(got[0].Payload) != "ready" || string(got[0].Segment) != "kv" {
			t.Fatalf("Take: %+v", got)
		}
		if in.Wait(time.Now().Add(time.Minute), nil) || time.Since(start) != time.Minute {
			t.Fatalf("an empty Wait returned true or not at its deadline (%v)", time.Since(start))
		}
		stop := make(chan struct{})
		go func() { woke <- in.Wait(time.Now().Add(time.Hour), stop) }()
		synctest.Wait()
		close(stop)
		if <-woke {
			t.Fatal("a stopped Wait reported a notification")
		}
		if in.Wait(time.Now(), nil) {
			t.Fatal("a Wait past its deadline reported a notification")
		}
	})
}

// TestDeliver: a notification reaches every subscriber of its export, or
// none: a full queue, an oversized payload, an export nobody subscribed to
// and an unknown name are refused and queue nothing; subscribing is only
// for the owner's tenant; a closed inbox and an ended export deliver no
// more; Take keeps to its count and byte budget.
func TestDeliver(t *testing.T) {
	x := NewExports(nil)
	buf := clientBuf(1, 64)
	e, err := x.Export("kv", "t1", buf, 0, 64, wire.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Export("other", "t1", buf, 0, 64, wire.RightWrite); err != nil {
		t.Fatal(err)
	}
	if err := deliver(x, "t1", "kv", []byte("x")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Deliver without subscribers: %v", err)
	}
	if err := deliver(x, "t1", "nope", []byte("x")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Deliver to an unknown name: %v", err)
	}
	a, b := NewInbox("a", 2), NewInbox("b", 3)
	if err := x.Subscribe("kv", "t2", a); !errors.Is(err, ErrNotFound) || strings.Contains(err.Error(), "t1") {
		t.Fatalf("Subscribe from another tenant: %v", err)
	}
	if err := x.Subscribe("nope", "t1", a); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Subscribe to an unknown name: %v", err)
	}
	for _, in := range []*Inbox{a, b} {
		if err := x.Subscribe("kv", "t1", in); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.Subscribe("other", "t1", b); err != nil {
		t.Fatal(err)
	}
	payload := []byte("n1")
	if err := deliver(x, "t1", "kv", payload); err != nil {
		t.Fatal(err)
	}
	payload[0] = 'X' // the queued copy is the inbox's own
	if err := deliver(x, "t1", "kv", []byte("n2")); err != nil {
		t.Fatal(err)
	}
	// a is full: nothing goes anywhere, b included.
	if err := deliver(x, "t1", "kv", []byte("n3")); !errors.Is(err, ErrLimit) {
		t.Fatalf("Deliver to a full queue: %v", err)
	}
	if err := deliver(x, "t1", "kv", make([]byte, wire.MaxNotify+1)); !errors.Is(err, ErrLimit) {
		t.Fatalf("Deliver of an oversized notification: %v", err)
	}
	if a.Len() != 2 || b.Len() != 2 || a.Subscriptions() != 1 || b.Subscriptions() != 2 {
		t.Fatalf("queued %d and %d, subscriptions %d and %d", a.Len(), b.Len(), a.Subscriptions(), b.Subscriptions())
	}
	take := func(in *Inbox, max, budget int) string {
		var s []string
		for _, n := range in.Take(nil, max, budget) {
			s = append(s, string(n.Segment)+"="+string(n.Payload))
		}
		return strings.Join(s, ",")
	}
	if got := take(a, 1, 1<<20); got != "kv=n1" {
		t.Fatalf("a's first: %s", got)
	}
	// The first always comes, the next only within the budget.
	if got := take(b, 10, 1); got != "kv=n1" {
		t.Fatalf("b within a 1-byte budget: %s", got)
	}
	if err := deliver(x, "t1", "other", nil); err != nil {
		t.Fatal(err)
	}
	if got := take(b, 10, 1<<20); got != "kv=n2,other=" {
		t.Fatalf("b's rest: %s", got)
	}
	b.Close()
	if err := x.Subscribe("kv", "t1", b); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Subscribe of a closed inbox: %v", err)
	}
	if err := deliver(x, "t1", "other", []byte("gone")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Deliver once the only subscriber closed: %v", err)
	}
	e.End(0)
	if a.Subscriptions() != 0 {
		t.Fatalf("a still subscribed to an ended export (%d)", a.Subscriptions())
	}
	if err := deliver(x, "t1", "kv", []byte("late")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Deliver after End: %v", err)
	}
	if got := take(a, 10, 1<<20); got != "kv=n2" {
		t.Fatalf("a after the end: %s", got)
	}
}

// TestLookupPath: a peer request's lookup, reference and release do not
// allocate, and lookups run beside exports and ends of other names (the
// race detector watches the shards).
func TestLookupPath(t *testing.T) {
	x := NewExports(nil)
	buf := clientBuf(1, 1<<16)
	if _, err := x.Export("kv", "", buf, 0, 1<<16, wire.RightRead); err != nil {
		t.Fatal(err)
	}
	if allocs := testing.AllocsPerRun(100, func() {
		seg, err := lookup(x, "", "kv")
		if err != nil || !seg.Acquire() {
			t.Fatal("lookup failed")
		}
		if _, ok := granted(x, "", "kv"); !ok {
			t.Fatal("no rights")
		}
		seg.Release()
	}); allocs != 0 {
		t.Fatalf("Lookup, Granted, Acquire, Release: %v allocations, want 0", allocs)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				seg, err := lookup(x, "", "kv")
				if err != nil || !seg.Acquire() {
					t.Error("a lookup beside other names' exports failed")
					return
				}
				seg.Release()
			}
		}()
	}
	for i := range 200 {
		e, err := x.Export(fmt.Sprintf("n%d", i), "", buf, 0, 4096, wire.RightRead)
		if err != nil {
			t.Fatal(err)
		}
		e.End(0)
	}
	wg.Wait()
	if buf.Refs() != 0 {
		t.Fatalf("%d references left", buf.Refs())
	}
}

// BenchmarkPeerRequestLookup is what every peer request costs the table:
// the lookup by name, the reference and its release, from many event
// loops at once over a table of many exports.
func BenchmarkPeerRequestLookup(b *testing.B) {
	x := NewExports(nil)
	buf := clientBuf(1, 1<<16)
	names := make([]string, 256)
	for i := range names {
		names[i] = fmt.Sprintf("kv%d", i)
		if _, err := x.Export(names[i], "", buf, 0, 4096, wire.RightRead|wire.RightWrite); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			seg, err := lookup(x, "", names[i%len(names)])
			if err != nil || !seg.Acquire() {
				b.Error("lookup failed")
				return
			}
			seg.Release()
			i++
		}
	})
}

// TestTenantNames: export names are per tenant. Two tenants export one
// name without meeting; a peer's client reaches its own tenant's export
// of a name, or another tenant's only where that export grants its
// tenant, and is refused with ErrDenied whether or not the other tenant
// exports the name; listings show a tenant its own exports; a request
// without a tenant is of the default tenant.
func TestTenantNames(t *testing.T) {
	cat := &catalog{}
	x := NewExports(cat)
	bufA, bufB, bufD := clientBuf(1, 4096), clientBuf(2, 4096), clientBuf(3, 4096)
	bufA.Bytes()[0], bufB.Bytes()[0] = 'a', 'b'
	a, err := x.ExportTo("kv", "A", []string{"C"}, bufA, 0, 4096, wire.RightRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Export("kv", "B", bufB, 0, 4096, wire.RightRead|wire.RightWrite); err != nil {
		t.Fatalf("tenant B cannot use the name tenant A exports: %v", err)
	}
	if _, err := x.Export("kv", "A", bufB, 0, 4096, wire.RightRead); !errors.Is(err, xfer.ErrExists) {
		t.Fatalf("the same name twice in one tenant: %v", err)
	}
	if _, err := x.Export("kv", "", bufD, 0, 4096, wire.RightRead); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Export("kv", DefaultTenant, bufD, 0, 4096, wire.RightRead); !errors.Is(err, xfer.ErrExists) {
		t.Fatalf("no tenant and the default tenant are one: %v", err)
	}
	if got := cat.got(); !slices.Equal(got, []string{"+kv:4096:1"}) {
		t.Fatalf("the catalog was told %v, want the default tenant's export only", got)
	}

	for _, c := range []struct {
		asker, owner string
		want         byte  // the first byte of what it reaches
		err          error // or the refusal
	}{
		{"A", "", 'a', nil}, {"B", "", 'b', nil}, {"A", "A", 'a', nil},
		{"", "", 0, nil}, {DefaultTenant, "", 0, nil}, // the default tenant's
		{"C", "A", 'a', nil}, // granted
		{"C", "", 0, ErrNotFound}, {"B", "A", 0, ErrDenied}, {"", "A", 0, ErrDenied},
		{"C", "B", 0, ErrDenied}, {"B", "Z", 0, ErrDenied}, {"A", "B", 0, ErrDenied},
	} {
		e, err := x.Resolve(c.asker, c.owner, "kv")
		switch {
		case c.err != nil && (!errors.Is(err, c.err) || e != nil):
			t.Errorf("Resolve(%q, %q) = %v, %v; want %v", c.asker, c.owner, e, err, c.err)
		case c.err == nil && (err != nil || e.Segment().Bytes()[0] != c.want):
			t.Errorf("Resolve(%q, %q) = %v, %v; want the export starting with %q", c.asker, c.owner, e, err, c.want)
		}
	}
	if _, err := x.Resolve("B", "A", "nope"); !errors.Is(err, ErrDenied) || !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("another tenant's absent name: %v, want ErrDenied (it does not say what exists)", err)
	}
	if n, all := x.Denied("A"); n != 3 || all != 6 {
		t.Fatalf("refusals counted for A's exports: %d of %d, want 3 of 6", n, all)
	}
	if n, _ := x.Denied("B"); n != 2 {
		t.Fatalf("refusals counted for B's exports: %d, want 2", n)
	}
	if !a.Grants("A") || !a.Grants("C") || a.Grants("B") || a.Grants("") || a.Tenant() != "A" {
		t.Fatal("Grants is wrong about A's export")
	}

	names := func(tenant string) []string {
		var out []string
		for _, s := range x.List(nil, tenant) {
			out = append(out, fmt.Sprintf("%s:%d", s.Name, s.Segment))
		}
		slices.Sort(out)
		return out
	}
	if got := names("B"); !slices.Equal(got, []string{"kv:2"}) {
		t.Fatalf("tenant B lists %v", got)
	}
	if got := names(DefaultTenant); !slices.Equal(got, []string{"kv:3"}) {
		t.Fatalf("the default tenant lists %v", got)
	}
	if got := names(""); !slices.Equal(got, []string{"kv:1", "kv:2", "kv:3"}) {
		t.Fatalf("the admin lists %v", got)
	}

	for _, grants := range [][]string{{"A"}, {"C", "C"}, {"bad name"}, {""}, make([]string, MaxGrants+1)} {
		if _, err := x.ExportTo("g", "A", grants, bufA, 0, 4096, wire.RightRead); !errors.Is(err, ErrInvalid) {
			t.Errorf("grants %q: %v", grants, err)
		}
	}
	if _, err := x.ExportTo("g", "", []string{DefaultTenant}, bufA, 0, 4096, wire.RightRead); !errors.Is(err, ErrInvalid) {
		t.Errorf("a grant of the default tenant by a client in none: %v", err)
	}
	a.End(0)
	if _, err := x.Resolve("C", "A", "kv"); !errors.Is(err, ErrDenied) {
		t.Fatalf("a granted export that ended: %v", err)
	}
}

// TestGrantOfDefaultTenant: an export that grants the default tenant
// reaches the peers' clients of that tenant, which the peer protocol
// sends without a tenant (WireTenant), as it reaches those that name it.
func TestGrantOfDefaultTenant(t *testing.T) {
	x := NewExports(nil)
	e, err := x.ExportTo("kv", "A", []string{DefaultTenant}, clientBuf(1, 4096), 0, 4096, wire.RightRead)
	if err != nil {
		t.Fatal(err)
	}
	for _, asker := range []string{"", DefaultTenant} {
		if got, err := x.Resolve(asker, "A", "kv"); err != nil || got != e {
			t.Errorf("Resolve(%q, A, kv) = %v, %v; want A's export, which grants the default tenant", asker, got, err)
		}
	}
	if _, err := x.Resolve("B", "A", "kv"); !errors.Is(err, ErrDenied) {
		t.Fatalf("tenant B reached A's export granted to the default tenant only: %v", err)
	}
}
