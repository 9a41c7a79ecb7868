package cluster

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestWalkMessagesRefused: a walk's word or a pull that is malformed, or
// names a pull never sent, is refused as a bad message and records
// nothing.
func TestWalkMessagesRefused(t *testing.T) {
	f := newNet(t, []string{"a", "b"}, Config{Shards: 16, Timeout: 2 * time.Second, ProbeEvery: time.Hour})
	a, b := f.node("a"), f.node("b")
	testutil.Eventually(t, 10*time.Second, func() bool { return len(a.c.Members()) == 2 }, "a seeing b")
	a.c.walks.mu.Lock()
	sent := a.c.walks.seq
	a.c.walks.mu.Unlock()
	walkedMsg := func(seq uint64, shards uint32, bits []byte) []byte {
		e := newEnc()
		e.u64(seq)
		e.u32(shards)
		e.b = append(e.b, bits...)
		return e.bytes()
	}
	taken := a.c.c.walksTaken.Load()
	for name, req := range map[string][]byte{
		"a pull never sent":      walkedMsg(sent+1, 16, []byte{0xff, 0xff}),
		"pull 0":                 walkedMsg(0, 16, []byte{0xff, 0xff}),
		"another shard count":    walkedMsg(sent, 32, []byte{0xff, 0xff, 0xff, 0xff}),
		"bits cut short":         walkedMsg(sent, 16, []byte{0xff}),
		"trailing bytes":         walkedMsg(sent, 16, []byte{0xff, 0xff, 0}),
		"another message format": append([]byte{msgVersion + 1}, walkedMsg(sent, 16, []byte{0xff, 0xff})[1:]...),
		"empty":                  nil,
	} {
		if _, err := a.c.onWalked("b", b.epoch, req); !errors.Is(err, ErrMessage) {
			t.Errorf("walk's word with %s: %v; want ErrMessage", name, err)
		}
	}
	if n := a.c.c.walksTaken.Load() - taken; n != 0 {
		t.Fatalf("%d refused walks taken", n)
	}
	for name, req := range map[string][]byte{
		"no pull number":  {msgVersion, 1, 2},
		"claims cut":      append(append([]byte{msgVersion}, make([]byte, 8)...), 0, 1),
		"another version": append([]byte{msgVersion + 1}, make([]byte, 8)...),
	} {
		if _, err := b.c.onPull("a", a.epoch, req); !errors.Is(err, ErrMessage) {
			t.Errorf("pull with %s: %v; want ErrMessage", name, err)
		}
	}
}

// TestEveryRebuildEnds: daemons started together, with homes by
// rendezvous and by claims in etcd, each hold keys of the others' shards;
// then one goes and comes back. Every home's rebuild of the shards it
// gained ends by the members' word (none waits on a member up).
func TestEveryRebuildEnds(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		t.Run(map[bool]string{false: "embedded", true: "fenced"}[fenced], func(t *testing.T) {
			ids := []string{"a", "b", "c"}
			f := newTombNet(t, ids, 32, fenced)
			settled := func() bool {
				for _, id := range ids {
					if f.node(id).c.Stats().Rebuilding != 0 {
						return false
					}
				}
				return true
			}
			rebuilding := func() []int {
				var n []int
				for _, id := range ids {
					n = append(n, f.node(id).c.Stats().Rebuilding)
				}
				return n
			}
			for i, id := range ids {
				k := fmt.Sprintf("rebuild/%s/%d", id, i)
				f.node(id).put(t, k, value(k, 4096))
			}
			testutil.Eventually(t, 10*time.Second, settled, "every rebuild ended after the start (shards waiting: %v)",
				testutil.Lazy(rebuilding))
			c := f.node("c")
			c.down.Store(true)
			for _, id := range []string{"a", "b"} {
				testutil.Eventually(t, 10*time.Second, seesKey(f.node(id), "rebuild", fenced, "a", "b"), "%s seeing c gone", id)
			}
			c.down.Store(false)
			for _, id := range ids {
				testutil.Eventually(t, 10*time.Second, seesKey(f.node(id), "rebuild", fenced, ids...), "%s seeing c back", id)
			}
			testutil.Eventually(t, 10*time.Second, settled, "every rebuild ended after c came back (shards waiting: %v)",
				testutil.Lazy(rebuilding))
			if st := f.node("a").c.Stats(); st.WalksTaken == 0 {
				t.Fatal("a took no member's word")
			}
		})
	}
}
