package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/directory/etcdtest"
)

// TestStoreReadRevisions: a fallback read reports the record's
// modification revision and, apart from it, the revision etcd served the
// read at (later, once other keys changed): the cache compares the
// latter with its watch to tell a read the feed has passed.
func TestStoreReadRevisions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv := etcdtest.Start(t)
	d := open(t, srv, "a", nil)
	m := directory.Member{ID: "b", Epoch: 3, Addr: "127.0.0.1:1", Caps: []string{"tcp"}}
	x := directory.Export{Owner: "b", Name: "w", Size: 4096, Rights: directory.RightRead, Epoch: 3, Generation: 1}
	mb, err := directory.EncodeMember(m)
	if err != nil {
		t.Fatal(err)
	}
	xb, err := directory.EncodeExport(x)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := d.cli.Put(ctx, "/test/members/b", string(mb))
	if err != nil {
		t.Fatal(err)
	}
	px, err := d.cli.Put(ctx, "/test/exports/b/w", string(xb))
	if err != nil {
		t.Fatal(err)
	}
	later, err := d.cli.Put(ctx, "/test/unrelated", "x")
	if err != nil {
		t.Fatal(err)
	}
	now := later.Header.Revision
	st := &store{d.Dir}
	r, err := st.GetMember(ctx, "b")
	if err != nil || !r.Found || r.Member.Epoch != 3 || r.Rev != pm.Header.Revision || r.At != now {
		t.Fatalf("GetMember = %+v, %v; want rev %d at %d", r, err, pm.Header.Revision, now)
	}
	e, err := st.GetExport(ctx, "b", "w")
	if err != nil || !e.Found || e.Export != x || e.Rev != px.Header.Revision || e.At != now {
		t.Fatalf("GetExport = %+v, %v; want rev %d at %d", e, err, px.Header.Revision, now)
	}
	if r, err := st.GetMember(ctx, "zz"); err != nil || r.Found || r.Rev != 0 || r.At != now {
		t.Fatalf("GetMember of nobody = %+v, %v; want at %d", r, err, now)
	}
	if e, err := st.GetExport(ctx, "b", "zz"); err != nil || e.Found || e.At != now {
		t.Fatalf("GetExport of nothing = %+v, %v; want at %d", e, err, now)
	}
}

// TestCaughtUp: only a watch response that carries every event up to its
// header revision refreshes the cache's age; a catch-up batch, whose
// header is etcd's current revision with events still to come, does not.
func TestCaughtUp(t *testing.T) {
	for _, c := range []struct {
		n         int
		last, hdr int64
		want      bool
	}{
		{0, 0, 40, true},      // a progress notification
		{1, 40, 40, true},     // a live event
		{3, 40, 40, true},     // a live transaction's events
		{1000, 39, 40, false}, // a catch-up batch with more to come
		{1, 12, 40, false},
	} {
		if got := caughtUp(c.n, c.last, c.hdr); got != c.want {
			t.Errorf("caughtUp(%d events, last %d, header %d) = %v, want %v", c.n, c.last, c.hdr, got, c.want)
		}
	}
}
