package cluster

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// slowEtcd is a daemon's Fence over an etcd that answers reads slowly:
// Refresh ends when its context does, or by the directory's own request
// timeout (timeout). lapsed, when set, says the daemon's claims are not
// current (its lease may have lapsed).
type slowEtcd struct {
	Fence
	timeout   time.Duration
	lapsed    atomic.Bool
	refreshes atomic.Int32
}

func (s *slowEtcd) Refresh(ctx context.Context, shards []int) error {
	s.refreshes.Add(1)
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	return s.Fence.Refresh(ctx, shards)
}

func (s *slowEtcd) Current() bool { return !s.lapsed.Load() && s.Fence.Current() }

// TestStaleRefusalRefreshWithinDeadline: a read whose home refuses it
// (the home's claims not current: it holds no generation) makes the
// reader read the shard's claim from etcd again; with etcd answering
// slowly, that read ends by the read's deadline, not by the directory's
// own request timeout (seconds): every answer comes before the deadline.
func TestStaleRefusalRefreshWithinDeadline(t *testing.T) {
	const timeout = 300 * time.Millisecond
	fence := newFakeFence()
	fences := map[string]*slowEtcd{}
	f := newNetWith(t, []string{"a", "b"}, Config{Shards: 16, Timeout: timeout, ProbeEvery: 20 * time.Millisecond},
		func(id string, c *Config) {
			s := &slowEtcd{Fence: fence.of(id, 1), timeout: 20 * timeout}
			fences[id] = s
			c.Fence = s
		})
	a := f.node("a")
	key := keyWithHomes(t, "slow", 16, []string{"b", "a", "b"})
	testutil.Eventually(t, 10*time.Second, seesKey(a, key, true, "a", "b"), "a seeing b claim the key's shard")

	fences["b"].lapsed.Store(true)
	start := time.Now()
	_, err := a.read(key, 4096)
	took := time.Since(start)
	if err == nil {
		t.Fatal("a read the key from a home whose claims lapsed")
	}
	if fences["a"].refreshes.Load() == 0 {
		t.Fatalf("a did not read the shard's claim again after b's refusal (%v): the test proves nothing", err)
	}
	if took > timeout+time.Second {
		t.Fatalf("the read took %v, past its deadline (%v): the claims' read from etcd was not bounded by it (%v)", took, timeout, err)
	}
}
