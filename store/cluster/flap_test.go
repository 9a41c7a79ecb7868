package cluster

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestClaimsDoNotFlapAcrossPartition: with etcd's shard claims, some
// daemons are cut from others while every one still reaches etcd (which
// lists them all). In "pair", a and b are cut from each other and both
// reach c: each sees the other gone and takes the shards its view makes
// its own, some of them the other's, but neither takes back what the
// other took from it while etcd lists it. In "isolated", a is cut from
// both, one after the other, with a claim round between (a partition
// reaches the members one at a time): while a still sees c it sees a
// majority and takes some of b's shards; once it sees nobody it lets them
// go and takes nobody's, while b and c take a's and those a let go.
// Either way the claims settle after a round instead of changing hands
// every round; once the cut heals, every shard goes back to its
// rendezvous home and stays there. The claim rounds are the test's own
// (no claimer runs), so that each step is one the test chose.
func TestClaimsDoNotFlapAcrossPartition(t *testing.T) {
	t.Run("pair", func(t *testing.T) { claimsAcrossPartition(t, [][2]string{{"a", "b"}}) })
	t.Run("isolated", func(t *testing.T) { claimsAcrossPartition(t, [][2]string{{"a", "b"}, {"a", "c"}}) })
}

func claimsAcrossPartition(t *testing.T, cuts [][2]string) {
	ids := []string{"a", "b", "c"}
	const shards = 64
	fence := newFakeFence()
	var net atomic.Pointer[fakeNet]
	fence.cut = func(id string) bool { n := net.Load(); return n != nil && n.node(id).down.Load() }
	f := newNetWith(t, ids, Config{Shards: shards, Timeout: time.Second, ProbeEvery: time.Hour},
		func(id string, c *Config) {
			c.Fence = fence.of(id, uint64(1000+slices.Index(ids, id)))
			c.manualClaims = true
			c.Directory = func() []string { return ids } // etcd lists every member: their leases live
		})
	net.Store(f)
	nodes := []*fakeNode{f.node("a"), f.node("b"), f.node("c")}
	// settled: every shard claimed by its home under members, as every
	// daemon knows.
	settled := func(members []string) func() bool {
		v := newView(members, shards)
		return func() bool {
			for _, n := range nodes {
				for _, cl := range n.c.ShardClaims() {
					if cl.Home != v.home(cl.Shard) || cl.Gen == 0 {
						return false
					}
				}
			}
			return true
		}
	}
	// round is one probe and one claim round of every daemon, in turn.
	round := func() {
		for _, n := range nodes {
			n.c.probe()
		}
		for _, n := range nodes {
			if err := n.c.claimRound(); err != nil {
				t.Fatalf("%s's claim round: %v", n.id, err)
			}
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { round(); return settled(ids)() }, "every shard claimed by its home")

	for i, c := range cuts {
		f.partition(c[0], c[1], true)
		round() // the views split; each side takes what its view gives it
		if i == 0 && len(cuts) == 2 {
			// a still sees c: a majority of the three etcd lists.
			took, all := 0, newView(ids, shards)
			for _, cl := range nodes[0].c.ShardClaims() {
				if cl.Home == "a" && all.home(cl.Shard) == "b" {
					took++
				}
			}
			if took == 0 {
				t.Fatalf("a, seeing a and c, took none of b's shards: the case this test is for did not happen")
			}
		}
	}
	for range 2 {
		round()
	}
	for _, n := range nodes {
		want := len(ids)
		for _, c := range cuts {
			if slices.Contains(c[:], n.id) {
				want--
			}
		}
		if got := n.c.Members(); len(got) != want {
			t.Fatalf("%s sees %v, want those cut from it gone", n.id, got)
		}
	}
	if len(cuts) == 2 {
		// a sees no majority: it holds none of the shards now.
		for _, cl := range nodes[1].c.ShardClaims() {
			if cl.Home == "a" {
				t.Fatalf("isolated a holds shard %d (gen %d)", cl.Shard, cl.Gen)
			}
		}
	}
	before := fence.gen()
	for range 10 {
		round()
	}
	if d := fence.gen() - before; d != 0 {
		t.Errorf("across the partition the claims changed %d times in 10 rounds, want none (flapping):%s", d, fence.since(before))
	}

	for _, c := range cuts {
		f.partition(c[0], c[1], false)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { round(); return settled(ids)() },
		"every shard back with its rendezvous home once the cut healed")
	before = fence.gen()
	for range 5 {
		round()
	}
	if d := fence.gen() - before; d != 0 {
		t.Errorf("after the heal the claims changed %d times in 5 rounds, want none", d)
	}
}

// TestLateFailureKeepsMemberUp: an exchange sent into a cut (or on a
// connection the cut stalled) may fail only after the members met again.
// Such a failure says nothing of the member now: a member that came up,
// or answered an exchange sent later, after the failed one was sent stays
// up (counted), where it went down and up again, moving its shards twice.
// A failure of an exchange sent after both still takes it down. Each time
// the member comes back, this daemon drops its connections to it that
// stayed silent (StallDropper), so that the exchanges that follow do not
// wait for a stalled connection's retransmissions.
func TestLateFailureKeepsMemberUp(t *testing.T) {
	f := newNet(t, []string{"a", "b"}, Config{Shards: 16, Timeout: time.Second, ProbeEvery: time.Hour})
	a := f.node("a")
	up := func() bool { return slices.Contains(a.c.Members(), "b") }
	cutErr := fmt.Errorf("exchange stalled by the cut: %w", errUnreachable)

	// Sent into the cut; b is back (a probe reached it) before it fails.
	sent := time.Now()
	f.partition("a", "b", true)
	testutil.Eventually(t, 10*time.Second, func() bool { a.c.probe(); return !up() }, "a seeing b cut off")
	f.partition("a", "b", false)
	testutil.Eventually(t, 10*time.Second, func() bool { a.c.probe(); return up() }, "a seeing b back")
	views := a.c.Stats().ViewChanges
	a.c.lost("b", cutErr, sent)
	if !up() || a.c.Stats().LateLosses != 1 || a.c.Stats().ViewChanges != views {
		t.Fatalf("a failure sent before b came back: b up %v, %d late losses, view changes %d → %d; want b up, 1, none",
			up(), a.c.Stats().LateLosses, views, a.c.Stats().ViewChanges)
	}

	// Sent, then b answers an exchange sent after it (a hello): late too.
	sent = time.Now()
	testutil.Eventually(t, 10*time.Second, func() bool { return time.Now().After(sent) }, "the clock passing the send")
	if err := a.c.hello("b"); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	a.c.lost("b", cutErr, sent)
	if !up() || a.c.Stats().LateLosses != 2 {
		t.Fatalf("a failure sent before b answered a later hello: b up %v, %d late losses; want b up, 2", up(), a.c.Stats().LateLosses)
	}

	// Sent after b last answered and came up: b goes down.
	testutil.Eventually(t, 10*time.Second, func() bool { return time.Now().After(answered) }, "the clock passing the hello")
	// Counted before b goes down: a message of b's that lands after, and
	// not the probe below, may be what brings it back.
	drops := a.drops("b")
	a.c.lost("b", cutErr, time.Now())
	if up() || a.c.Stats().LateLosses != 2 {
		t.Fatalf("a failure sent after b last answered: b up %v, %d late losses; want b down, 2", up(), a.c.Stats().LateLosses)
	}
	// Each return asked for a's silent connections to b to go: at the
	// first above, and again now.
	testutil.Eventually(t, 10*time.Second, func() bool { a.c.probe(); return up() }, "a seeing b back")
	if drops < 1 || a.drops("b") != drops+1 {
		t.Fatalf("stalled connections dropped %d times by the first return, %d by the second; want at least 1, then 1 more",
			drops, a.drops("b")-drops)
	}
}

// TestExchangeBeforeStallDropKeepsMemberUp: an exchange sent after a
// member came up but before its stalled connections were dropped may go
// on one of them and fail as the connection is closed under it; that
// failure is a late one, and the member stays up (in the soaks, a member
// went down and up again within a millisecond so).
func TestExchangeBeforeStallDropKeepsMemberUp(t *testing.T) {
	f := newNet(t, []string{"a", "b"}, Config{Shards: 16, Timeout: time.Second, ProbeEvery: time.Hour})
	a := f.node("a")
	up := func() bool { return slices.Contains(a.c.Members(), "b") }
	f.partition("a", "b", true)
	testutil.Eventually(t, 10*time.Second, func() bool { a.c.probe(); return !up() }, "a seeing b cut off")
	f.partition("a", "b", false)
	testutil.Eventually(t, 10*time.Second, func() bool { a.c.probe(); return up() }, "a seeing b back")
	a.dmu.Lock()
	sent := a.dropAt["b"] // after b came up, as the drop began
	a.dmu.Unlock()
	a.c.lost("b", fmt.Errorf("connection closed as a stalled one: %w", errUnreachable), sent)
	if !up() || a.c.Stats().LateLosses != 1 {
		t.Fatalf("a failure of an exchange sent as b's stalled connections were dropped: b up %v, %d late losses; want up, 1",
			up(), a.c.Stats().LateLosses)
	}
}

// TestProbeAsksMembersAtOnce: members that do not answer (a stopped daemon,
// a link that drops its packets) hold a probe round for one timeout, not
// one per such member in turn: the prober asks every member at once, so a
// member back from a cut is seen within the round while three others stay
// silent for the whole of it (30 s here).
func TestProbeAsksMembersAtOnce(t *testing.T) {
	f := newNet(t, []string{"a", "s1", "s2", "s3", "back"}, Config{Shards: 16, Timeout: 30 * time.Second, ProbeEvery: time.Hour})
	a := f.node("a")
	f.partition("a", "back", true)
	testutil.Eventually(t, 10*time.Second, func() bool { a.c.probe(); return !slices.Contains(a.c.Members(), "back") }, "back cut off")
	release := f.silence(t, "s1", "s2", "s3")
	f.partition("a", "back", false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.c.probe()
	}()
	waiting := func() int { f.cutMu.Lock(); defer f.cutMu.Unlock(); return f.helloWaiting }
	testutil.Eventually(t, 10*time.Second, func() bool { return waiting() == 3 && slices.Contains(a.c.Members(), "back") },
		"the three silent members asked at once (%d hellos waiting) and back seen up (members %v)",
		testutil.Lazy(waiting), testutil.Lazy(a.c.Members))
	release()
	<-done
}
