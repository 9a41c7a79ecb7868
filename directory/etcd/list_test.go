package etcd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// putMembers writes n member records (as other daemons' registrations,
// without a lease) and returns the revision of the last.
func putMembers(t *testing.T, d testDir, n int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rev int64
	for i := range n {
		m := directory.Member{ID: fmt.Sprintf("m%03d", i), Epoch: uint64(i + 1), Addr: fmt.Sprintf("10.0.%d.%d:7000", i/250, i%250),
			Caps: []string{"tcp", "rdma", "notify"}, Started: 1}
		val, err := directory.EncodeMember(m)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := d.cli.Put(ctx, d.memberKey(m.ID), string(val))
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	return rev
}

// awaitPrimed waits for d's first listing.
func awaitPrimed(t *testing.T, d testDir, limit time.Duration) {
	t.Helper()
	select {
	case <-d.primed:
	case <-time.After(limit):
		t.Fatalf("no listing within %v:\n%s", limit, d.log)
	}
}

// TestListingPaged: the listing reads the prefix a page at a time, so a
// prefix too large for one response (here: the client takes 2 KiB at
// most, and the records are eight times that) is still listed, whole.
func TestListingPaged(t *testing.T) {
	srv := etcdtest.Start(t)
	w := open(t, srv, "w", nil)
	const n = 120
	rev := putMembers(t, w, n)

	b := open(t, srv, "b", func(c *Config) { c.listPage, c.maxRecv = 5, 2048 })
	awaitPrimed(t, b, 10*time.Second)
	if got := len(b.Cache().Members()); got != n {
		t.Fatalf("the listing has %d members, want %d:\n%s", got, n, b.log)
	}
	if m, ok := b.Cache().Peek("m077"); !ok || m.Epoch != 78 {
		t.Fatalf("m077 listed as %+v %v", m, ok)
	}
	if got := b.Cache().Stats().Rev; got < rev {
		t.Fatalf("listed at revision %d, before the last write (%d)", got, rev)
	}
}

// TestListingOneRevision: every page of a listing is read at the first
// page's revision, whatever is written meanwhile: the listing is the
// prefix as of that revision, which the watch then follows from the next
// one. Here a key of a later page is deleted, one added and one changed
// while the first page is being taken in; the listing has them as they
// were.
func TestListingOneRevision(t *testing.T) {
	srv := etcdtest.Start(t)
	d := open(t, srv, "d", func(c *Config) { c.listPage = 3 })
	awaitPrimed(t, d, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := func(i int) string { return fmt.Sprintf("/test/zz/k%02d", i) }
	var before int64
	for i := range 9 {
		resp, err := d.cli.Put(ctx, key(i), "old")
		if err != nil {
			t.Fatal(err)
		}
		before = resp.Header.Revision
	}
	got := map[string]string{}
	pages := 0
	rev, err := d.listPages(func(kvs []*mvccpb.KeyValue) {
		pages++
		for _, kv := range kvs {
			got[string(kv.Key)] = string(kv.Value)
		}
		if pages != 1 {
			return
		}
		if _, err := d.cli.Delete(ctx, key(7)); err != nil {
			t.Error(err)
		}
		if _, err := d.cli.Put(ctx, key(4)+"a", "new"); err != nil {
			t.Error(err)
		}
		if _, err := d.cli.Put(ctx, key(5), "new"); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if rev != before {
		t.Fatalf("listed at revision %d, want %d (the revision before the writes during it)", rev, before)
	}
	if pages < 3 {
		t.Fatalf("%d pages of 3 keys for 9 keys: the listing is not paged", pages)
	}
	want := map[string]string{}
	for i := range 9 {
		want[key(i)] = "old"
	}
	if !maps.Equal(got, want) {
		t.Fatalf("the listing at revision %d has\n%v\nwant the prefix as of then:\n%v", rev, got, want)
	}
}

// TestListingTooLarge: a prefix holding more keys than a listing takes is
// refused after its first page (which says how many there are), logged
// once as such, and the directory is not primed with part of it; once
// the prefix is back within the bound, the listing goes through.
func TestListingTooLarge(t *testing.T) {
	srv := etcdtest.Start(t)
	w := open(t, srv, "w", nil)
	putMembers(t, w, 12)

	d := open(t, srv, "d", func(c *Config) { c.listPage, c.listMax = 4, 10 })
	testutil.Eventually(t, 10*time.Second, func() bool { return d.log.count("directory listing refused") > 0 },
		"the listing refused")
	taken := 0
	if _, err := d.listPages(func(kvs []*mvccpb.KeyValue) { taken += len(kvs) }); !errors.Is(err, errListTooLarge) {
		t.Fatalf("listing 12 keys with a bound of 10: %v, want errListTooLarge", err)
	}
	if taken != 0 {
		t.Fatalf("a refused listing handed on %d keys", taken)
	}
	select {
	case <-d.primed:
		t.Fatalf("the directory was primed with a refused listing: %d members", len(d.Cache().Members()))
	default:
	}
	if n := d.log.count("directory listing refused"); n != 1 {
		t.Fatalf("%d log lines for the refused listings, want 1 (then a count per interval):\n%s", n, d.log)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 3 {
		if _, err := w.cli.Delete(ctx, w.memberKey(fmt.Sprintf("m%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	awaitPrimed(t, d, 10*time.Second)
	ids := []string{}
	for _, mv := range d.Cache().Members() {
		ids = append(ids, mv.Member.ID)
	}
	slices.Sort(ids)
	if len(ids) != 9 || ids[0] != "m003" {
		t.Fatalf("listed %v, want m003..m011", ids)
	}
}
