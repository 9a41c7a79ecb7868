package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
)

// fakeFence is etcd's shard claims for the daemons of one test, in
// memory: a claim is taken only at the generation expected, every change
// goes to every daemon's watcher.
type fakeFence struct {
	// cut, when set, says a daemon cannot reach etcd (it is down in the
	// test's net): it takes and releases nothing and its claims are not
	// current. Set before the daemons run.
	cut func(id string) bool
	// mu guards the fields below.
	mu       sync.Mutex
	claims   map[int]ShardClaim
	next     uint64
	watchers map[string]func([]ShardClaim)
	// changes is every claim taken or released, in order (for a test's
	// failure message).
	changes []fenceChange
}

// fenceChange is one claim taken or released: its generation, in words.
type fenceChange struct {
	gen  uint64
	says string
}

func newFakeFence() *fakeFence {
	return &fakeFence{claims: map[int]ShardClaim{}, next: 100, watchers: map[string]func([]ShardClaim){}}
}

// of is daemon id's view of the fence (its Config.Fence).
func (f *fakeFence) of(id string, epoch uint64) Fence { return &fenceOf{f: f, id: id, epoch: epoch} }

type fenceOf struct {
	f     *fakeFence
	id    string
	epoch uint64
}

var _ Fence = (*fenceOf)(nil)

func (o *fenceOf) Watch(fn func([]ShardClaim)) {
	o.f.mu.Lock()
	if fn == nil {
		delete(o.f.watchers, o.id)
		o.f.mu.Unlock()
		return
	}
	o.f.watchers[o.id] = fn
	now := o.f.allLocked()
	o.f.mu.Unlock()
	if len(now) > 0 {
		fn(now)
	}
}

func (f *fakeFence) allLocked() []ShardClaim {
	out := make([]ShardClaim, 0, len(f.claims))
	for _, c := range f.claims {
		out = append(out, c)
	}
	return out
}

// notify hands changed to every watcher (f.mu not held).
func (f *fakeFence) notify(changed []ShardClaim) {
	if len(changed) == 0 {
		return
	}
	f.mu.Lock()
	fns := make([]func([]ShardClaim), 0, len(f.watchers))
	for _, fn := range f.watchers {
		fns = append(fns, fn)
	}
	f.mu.Unlock()
	for _, fn := range fns {
		fn(changed)
	}
}

func (o *fenceOf) Take(_ context.Context, shards []int, expect []uint64) ([]ShardClaim, error) {
	f := o.f
	if !o.Current() {
		return nil, errUnreachable
	}
	f.mu.Lock()
	var won []ShardClaim
	for i, s := range shards {
		cur := f.claims[s]
		// 0 expects no claim (none ever, or released: etcd's key absent).
		if expect[i] == 0 && cur.Home != "" || expect[i] != 0 && cur.Gen != expect[i] {
			continue
		}
		f.next++
		c := ShardClaim{Shard: s, Home: o.id, Epoch: o.epoch, Gen: f.next}
		f.claims[s] = c
		won = append(won, c)
		f.changes = append(f.changes, fenceChange{c.Gen, fmt.Sprintf("%s takes shard %d from %q", o.id, s, cur.Home)})
	}
	f.mu.Unlock()
	f.notify(won)
	return won, nil
}

func (o *fenceOf) Release(_ context.Context, shards []int, gens []uint64) error {
	f := o.f
	if !o.Current() {
		return errUnreachable
	}
	f.mu.Lock()
	var changed []ShardClaim
	for i, s := range shards {
		cur := f.claims[s]
		if cur.Home != o.id || cur.Gen != gens[i] {
			continue
		}
		f.next++
		c := ShardClaim{Shard: s, Gen: f.next}
		f.claims[s] = c
		changed = append(changed, c)
		f.changes = append(f.changes, fenceChange{c.Gen, fmt.Sprintf("%s releases shard %d", o.id, s)})
	}
	f.mu.Unlock()
	f.notify(changed)
	return nil
}

func (o *fenceOf) Refresh(_ context.Context, shards []int) error {
	f := o.f
	f.mu.Lock()
	var now []ShardClaim
	for _, s := range shards {
		if c, ok := f.claims[s]; ok {
			now = append(now, c)
		}
	}
	fn := f.watchers[o.id]
	f.mu.Unlock()
	if fn != nil && len(now) > 0 {
		fn(now)
	}
	return nil
}

func (o *fenceOf) Current() bool { return o.f.cut == nil || !o.f.cut(o.id) }

// gen is the latest generation handed out: it grows by one with every
// claim taken or released.
func (f *fakeFence) gen() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next
}

// since is the changes after generation gen, one a line.
func (f *fakeFence) since(gen uint64) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, c := range f.changes {
		if c.gen > gen {
			fmt.Fprintf(&b, "\n\tgen %d: %s", c.gen, c.says)
		}
	}
	return b.String()
}
