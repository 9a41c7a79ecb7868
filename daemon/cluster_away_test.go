package daemon

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
)

// TestStoreAcrossHostsHolderAway: d3, a holder, is stopped (SIGSTOP).
//   - The queue's Exists of keys whose home is d3 waits for d3's answer
//     (until the cluster's timeout) in the background: an Exists of a key
//     stored on d2, submitted after it on the same queue, is answered
//     first.
//   - Keys d3 holds whose homes (d1, d2) live are removed through d1: d2's
//     copies go at once; d3's stay, remembered by their homes as
//     tombstones. When d3 resumes, its homes ask it again to drop them (or
//     answer "removed" to its re-announcement): no copy of a removed key is
//     left anywhere, every tombstone is spent, and the keys not removed are
//     still on d3.
func TestStoreAcrossHostsHolderAway(t *testing.T) {
	if spec := os.Getenv(clusterChildEnv); spec != "" {
		clusterChild(t, spec)
		return
	}
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast store across hosts away test key")
	d1 := startPeerWith(t, "d1", key, "", clusterConfig, dialsIn("d2"), dialsIn("d3"))
	d2 := startPeerWith(t, "d2", key, "", clusterConfig, d1.peer(), dialsIn("d3"))
	dir := t.TempDir()
	sock := testConfig(dir).Socket
	child := startChild(t, "TestStoreAcrossHostsHolderAway",
		clusterChildEnv+"="+strings.Join([]string{dir, key, d1.d.PeerAddr(), d2.d.PeerAddr()}, "|"), sock)
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2", "d3")
	c3, err := client.Dial(sock, client.Options{Name: "putter-d3", CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()

	const n = 48
	var removed, d3Homed [][]byte
	for i := range n {
		k := fmt.Appendf(nil, "away/%02d", i)
		if err := c3.PutBytes(k, clusterValue(k, 4096), false); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, hs, err := d2.d.cluster.Locate(k)
			return err == nil && len(hs) == 1 && hs[0].ID == "d3"
		}, "%s announced", k)
		if d2.d.cluster.Home(k) == "d3" {
			d3Homed = append(d3Homed, k)
		} else {
			removed = append(removed, k)
		}
	}
	if len(removed) == 0 || len(d3Homed) == 0 {
		t.Fatalf("%d keys homed on d1/d2, %d on d3: the keys do not cover both", len(removed), len(d3Homed))
	}
	// d2 reads the keys to be removed: it holds copies too.
	c2 := d2.dial(t, "reader")
	for _, k := range removed {
		if _, err := c2.GetBytes(k); err != nil {
			t.Fatalf("get %s on d2: %v", k, err)
		}
	}
	local := []byte("away/local")
	if err := c2.PutBytes(local, clusterValue(local, 512), false); err != nil {
		t.Fatal(err)
	}

	if err := child.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = child.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()

	// The queue's Exists does not hold the worker while d3 is silent.
	q, err := c2.OpenQueue(16)
	if err != nil {
		t.Fatal(err)
	}
	// Keys no daemon holds whose home is d3: a miss is never cached, so
	// their Exists asks d3.
	var absent [][]byte
	for i := 0; len(absent) < 8; i++ {
		k := fmt.Appendf(nil, "away/absent/%d", i)
		if d2.d.cluster.Home(k) == "d3" {
			absent = append(absent, k)
		}
	}
	slow, err := c2.NewResults(len(absent))
	if err != nil {
		t.Fatal(err)
	}
	quick, err := c2.NewResults(1)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if ok, err := q.Exists(absent, slow, 1); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := q.Exists([][]byte{local}, quick, 2); !ok || err != nil {
		t.Fatal(ok, err)
	}
	cqes := make([]client.Completion, 1)
	if got, err := q.Reap(cqes, 1, 10*time.Second); got != 1 || err != nil {
		t.Fatalf("reap: %d %v", got, err)
	}
	first, firstAt := cqes[0], time.Since(start)
	if got, err := q.Reap(cqes, 1, 10*time.Second); got != 1 || err != nil {
		t.Fatalf("reap: %d %v", got, err)
	}
	second, secondAt := cqes[0], time.Since(start)
	t.Logf("exists of a local key answered after %v, of keys homed on the stopped d3 after %v", firstAt, secondAt)
	if first.UserData != 2 || first.N != 1 {
		t.Fatalf("first answer %+v after %v: want the local key's (user data 2, 1 found) before the one waiting on d3", first, firstAt)
	}
	if second.UserData != 1 || second.N != 0 || secondAt > 2*time.Second+2*time.Second {
		t.Fatalf("second answer %+v after %v: want the keys homed on d3 (none found), by the cluster's timeout", second, secondAt)
	}

	// Remove through d1 while d3 is stopped.
	hits := func() uint64 { return d1.d.cluster.Stats().TombHits + d2.d.cluster.Stats().TombHits }
	hitsBefore := hits()
	c1 := d1.dial(t, "remover")
	results := make([]error, len(removed))
	if err := c1.StoreRemove(removed, results, client.WithDeadline(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	for i, err := range results {
		if err != nil {
			t.Fatalf("remove %s: %v", removed[i], err)
		}
	}
	tombs := func() int { return d1.d.cluster.Stats().Tombstones + d2.d.cluster.Stats().Tombstones }
	// Each removed copy on d3 is remembered by its home, or was spent
	// already: an announcement d3 sent before it stopped, handled after
	// the removal, was answered "removed" (d3 drops the copy when it
	// reads that answer). Whether every copy goes is checked once d3
	// resumes, below.
	tombStats := func() any {
		var b strings.Builder
		for _, d := range []*peerDaemon{d1, d2} {
			st := d.d.cluster.Stats()
			fmt.Fprintf(&b, " %s: tombstones %d, kept %d, hits %d, handed %d, taken %d, expired %d, evicted %d, view changes %d, members %d;",
				d.d.cfg.DaemonID, st.Tombstones, st.TombsKept, st.TombHits, st.TombsHanded, st.TombsTaken, st.TombExpired, st.TombEvicted,
				st.ViewChanges, st.Members)
		}
		return b.String()
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return tombs()+int(hits()-hitsBefore) >= len(removed) },
		"a tombstone on the homes (or a \"removed\" answer) for each of the %d removed keys d3 holds:%s",
		len(removed), testutil.Lazy(tombStats))
	for _, k := range removed {
		if _, err := d2.d.stores[0].Stat(k); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("d2 still holds removed %s: %v", k, err)
		}
	}

	if err := child.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	// d3's copies go once its homes hear from it again.
	testutil.Eventually(t, 20*time.Second, func() bool {
		ks, _, err := c3.StoreList([]byte("away/"), nil, n+1)
		return err == nil && len(ks) == len(d3Homed)
	}, "d3 holding only the %d keys not removed: %s", len(d3Homed), testutil.Lazy(func() any {
		ks, _, err := c3.StoreList([]byte("away/"), nil, n+1)
		return fmt.Sprint(len(ks), err)
	}))
	// Every tombstone is spent: by a drop asked again when d3 came back,
	// or by the "removed" answer to its re-announcement.
	testutil.Eventually(t, 10*time.Second, func() bool { return tombs() == 0 }, "tombstones spent: %d left",
		testutil.Lazy(func() any { return tombs() }))
	// How each went varies (a home's tombstone and its keeper's copy may
	// each be spent by a drop or a "removed" answer, or settled when d3
	// announces its copy gone, which counts neither): what must hold is
	// that none went by expiring or being evicted, which would have let
	// its copy live.
	var lost uint64
	for _, d := range []*peerDaemon{d1, d2} {
		st := d.d.cluster.Stats()
		lost += st.TombExpired + st.TombEvicted
	}
	if lost != 0 {
		t.Fatalf("%d tombstones expired or were evicted, for %d removed keys", lost, len(removed))
	}
	for _, k := range removed {
		if _, err := c2.GetBytes(k); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("get removed %s on d2: %v, want NOT_FOUND", k, err)
		}
	}
	for _, k := range d3Homed {
		if v, err := c2.GetBytes(k); err != nil || len(v) != 4096 {
			t.Fatalf("get %s (not removed) on d2: %d bytes, %v", k, len(v), err)
		}
	}
}
