package etcd

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestRefusedRecordsLogRateLimited: records that do not decode are
// skipped and logged, a line per interval with a count, not a line each:
// one writer of bad records (or one bad record read on every fallback
// lookup of its id) must not flood this daemon's log.
func TestRefusedRecordsLogRateLimited(t *testing.T) {
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	join(t, a, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const bad = 50
	for i := range bad {
		if _, err := a.cli.Put(ctx, fmt.Sprintf("/test/members/x%d", i), `{"id":`); err != nil {
			t.Fatal(err)
		}
		if _, err := a.cli.Put(ctx, fmt.Sprintf("/test/shards/%d", i), `[]`); err != nil {
			t.Fatal(err)
		}
	}
	last, err := a.cli.Put(ctx, "/test/unrelated", "x")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return a.Cache().Stats().Rev >= last.Header.Revision },
		"the watch brings the bad records")
	// And as many fallback reads of one of them.
	st := &store{a.Dir}
	for range bad {
		if r, err := st.GetMember(ctx, "x0"); err != nil || r.Found {
			t.Fatalf("GetMember of a bad record = %+v, %v", r, err)
		}
	}
	if n := a.log.count("directory record refused"); n != 1 {
		t.Fatalf("%d log lines for %d bad member records and %d reads of one, want 1 (then a count per interval):\n%s",
			n, bad, bad, a.log)
	}
	if n := a.log.count("shard claim refused"); n != 1 {
		t.Fatalf("%d log lines for %d bad shard claims, want 1:\n%s", n, bad, a.log)
	}
	if m, ok := a.Cache().Peek("x0"); ok {
		t.Fatalf("a bad record is in the cache: %+v", m)
	}
}
