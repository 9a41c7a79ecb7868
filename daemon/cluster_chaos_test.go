package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// chaosSize is the size of key k's value in TestStoreAcrossHostsChaos:
// every put of k stores the same bytes, so any answer of a get can be
// checked exactly.
func chaosSize(k []byte) int { return 1024 + int(k[len(k)-1])*97 }

// TestStoreAcrossHostsChaos: four clients (two on d1, two on d2) put, get
// and remove keys at random while d3, a holder and a home, is stopped
// (SIGSTOP), resumed, then killed (SIGKILL). Every answer is the exact
// bytes of the key, a miss or a named error (UNAVAILABLE, DEADLINE
// EXCEEDED, BUSY, RESOURCE_EXHAUSTED, ALREADY_EXISTS), each before its
// deadline; afterwards nothing is pinned on d1 or d2 and no claim is held
// there.
func TestStoreAcrossHostsChaos(t *testing.T) {
	if spec := os.Getenv(clusterChildEnv); spec != "" {
		clusterChild(t, spec)
		return
	}
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast store across hosts chaos test key")
	d1 := startPeerWith(t, "d1", key, "", clusterConfig, dialsIn("d2"), dialsIn("d3"))
	d2 := startPeerWith(t, "d2", key, "", clusterConfig, d1.peer(), dialsIn("d3"))
	dir := t.TempDir()
	sock := testConfig(dir).Socket
	child := startChild(t, "TestStoreAcrossHostsChaos",
		clusterChildEnv+"="+strings.Join([]string{dir, key, d1.d.PeerAddr(), d2.d.PeerAddr()}, "|"), sock)
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2", "d3")

	// d3 holds a share of the keys before the faults.
	c3, err := client.Dial(sock, client.Options{Name: "putter-d3", CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const nkeys = 64
	keys := make([][]byte, nkeys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "chaos/%02d", i)
		if i%2 == 0 {
			if err := c3.PutBytes(keys[i], clusterValue(keys[i], chaosSize(keys[i])), false); err != nil {
				t.Fatalf("put %s on d3: %v", keys[i], err)
			}
		}
	}
	c3.Close()

	// The cluster's timeout is 2 s; a get may take two remote steps.
	const deadline = 2*2*time.Second + time.Second
	var stop atomic.Bool
	var ops, exact, misses, named atomic.Int64
	var wg sync.WaitGroup
	fail := make(chan string, 16)
	report := func(format string, args ...any) {
		select {
		case fail <- fmt.Sprintf(format, args...):
		default:
		}
	}
	for ci := range 4 {
		d := d1
		if ci%2 == 1 {
			d = d2
		}
		c := d.dial(t, fmt.Sprintf("chaos-%d", ci))
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(ci), 7))
			for !stop.Load() {
				k := keys[rng.IntN(nkeys)]
				want := clusterValue(k, chaosSize(k))
				op := rng.IntN(10)
				start := time.Now()
				var err error
				what := "get"
				switch {
				case op < 6:
					var v []byte
					v, err = c.GetBytes(k)
					if err == nil {
						if !bytes.Equal(v, want) {
							report("get %s on %s: %d bytes that are not the value", k, d.cfg.DaemonID, len(v))
							return
						}
						exact.Add(1)
					}
				case op < 9:
					what = "put"
					err = c.PutBytes(k, want, false)
				default:
					what = "remove"
					err = c.StoreRemove([][]byte{k}, make([]error, 1))
				}
				if took := time.Since(start); took > deadline {
					report("%s %s on %s answered after %v (%v)", what, k, d.cfg.DaemonID, took, err)
					return
				}
				ops.Add(1)
				switch {
				case err == nil:
				case errors.Is(err, client.ErrNotFound):
					misses.Add(1)
				case errors.Is(err, client.ErrUnavailable), errors.Is(err, client.ErrDeadlineExceeded),
					errors.Is(err, client.ErrBusy), errors.Is(err, client.ErrResourceExhausted),
					errors.Is(err, client.ErrAlreadyExists):
					named.Add(1)
				default:
					report("%s %s on %s: %v, not a named error", what, k, d.cfg.DaemonID, err)
					return
				}
			}
		}()
	}
	wait := paceFaults(t, fail, &stop, &wg)
	wait(500 * time.Millisecond)
	if err := child.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	wait(3 * time.Second)
	if err := child.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wait(time.Second)
	if err := child.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-child.exited
	wait(3 * time.Second)
	stop.Store(true)
	wg.Wait()
	select {
	case msg := <-fail:
		t.Fatal(msg)
	default:
	}
	t.Logf("%d answers: %d exact gets, %d misses, %d named errors", ops.Load(), exact.Load(), misses.Load(), named.Load())
	if exact.Load() == 0 || ops.Load() < 100 {
		t.Fatalf("%d answers, %d exact gets: the clients did not run", ops.Load(), exact.Load())
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return d1.d.cluster.Holds() == 0 && d2.d.cluster.Holds() == 0 },
		"claims released on d1 and d2")
	noPinsLeft(t, d1, d2)
}

// noPinsLeft waits until nothing is pinned on ds: a value a holder is
// still sending for a read whose reader gave up is pinned until the send
// ends, by the exchange's deadline; a pin past that is a leak.
func noPinsLeft(t *testing.T, ds ...*peerDaemon) {
	t.Helper()
	for _, d := range ds {
		testutil.Eventually(t, 10*time.Second, func() bool { return d.d.stores[0].Stats().Pins == 0 },
			"%s: no pins left once every read in flight ended (%d pinned: %s)", d.cfg.DaemonID,
			testutil.Lazy(func() uint64 { return d.d.stores[0].Stats().Pins }),
			testutil.Lazy(func() string { return pinnedKeys(d) }))
	}
}

// pinnedKeys names the keys pinned on d, with their pins and tiers, for a
// failure's message: which value a leak holds says which path took it.
func pinnedKeys(d *peerDaemon) string {
	infos, _, err := d.d.stores[0].List(nil, 1<<16)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, ki := range infos {
		if ki.Pins > 0 {
			fmt.Fprintf(&b, "%s (%d pins, %d bytes, L1 %v, L2 %v, dirty %v) ", ki.Key, ki.Pins, ki.Size, ki.InL1, ki.InL2, ki.Dirty)
		}
	}
	if b.Len() == 0 {
		return "no listed key pinned"
	}
	return b.String()
}

// chaosEtcd makes c a daemon of TestStoreAcrossHostsChaosEtcd's cluster:
// directory = etcd at endpoint, members' leases of 1 s, a staleness budget
// of 2 s on the wall clock.
func chaosEtcd(c *Config, endpoint string) {
	c.Directory = "etcd"
	c.EtcdEndpoints = []string{endpoint}
	c.EtcdPrefix = "/chaos/"
	c.EtcdLeaseTTL = Duration(time.Second)
	c.StalenessBudget = Duration(2 * time.Second)
	c.Clock = nil
}

// chaosOwned is what one client of TestStoreAcrossHostsChaosEtcd knows of
// a key it alone puts and removes: after an acknowledged durable put it is
// present, after an acknowledged remove absent, after any failure of
// either unknown.
type chaosOwned uint8

const (
	ownedUnknown chaosOwned = iota
	ownedPresent
	ownedAbsent
)

// TestStoreAcrossHostsChaosEtcd: with directory = etcd and store_replicas
// = 2, four clients (two on d1, two on d2) each put (durable), remove and
// get keys they alone write, and get the others' keys, while d3 (a home
// of a third of the shards, in etcd, and a holder of copies) is killed
// (SIGKILL), and then etcd itself is stopped past the staleness budget and
// started again. Every answer meanwhile is the exact bytes of the key, a
// miss or a named error, before its deadline. Once the cluster has settled
// (d3's shards claimed by d1 and d2), nothing acknowledged is lost: every
// key whose last write was an acknowledged durable put is read byte-exact
// on both d1 and d2; and nothing stale is served: every key whose last
// write was an acknowledged remove is a miss on both. Nothing stays pinned
// or held.
func TestStoreAcrossHostsChaosEtcd(t *testing.T) {
	if spec := os.Getenv(clusterChildEnv); spec != "" {
		clusterChild(t, spec)
		return
	}
	srv := etcdtest.Start(t)
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast store across hosts etcd chaos test key")
	cfg := func(c *Config) {
		clusterConfig(c)
		replicaConfig(c)
		c.StoreL2Path = ""
		chaosEtcd(c, srv.Endpoint())
	}
	d1 := startPeerWith(t, "d1", key, "", cfg)
	d2 := startPeerWith(t, "d2", key, "", cfg)
	dir := t.TempDir()
	sock := testConfig(dir).Socket
	child := startChild(t, "TestStoreAcrossHostsChaosEtcd",
		clusterChildEnv+"="+strings.Join([]string{dir, key, "-", "-", "replicas", "etcd=" + srv.Endpoint()}, "|"), sock)
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2", "d3")
	// Every shard claimed, a share of them by d3, and d1 and d2 agree.
	claimedBy := func(ids ...string) func() bool {
		return func() bool {
			a, b := d1.d.cluster.ShardClaims(), d2.d.cluster.ShardClaims()
			homes := map[string]int{}
			for s := range a {
				if a[s].Gen == 0 || a[s] != b[s] {
					return false
				}
				homes[a[s].Home]++
			}
			for _, id := range ids {
				if homes[id] == 0 {
					return false
				}
			}
			return len(homes) == len(ids)
		}
	}
	testutil.Eventually(t, 30*time.Second, claimedBy("d1", "d2", "d3"), "every shard claimed by d1, d2 and d3")

	const clients, perClient = 4, 12
	owned := make([][][]byte, clients)
	var all [][]byte
	for ci := range clients {
		for j := range perClient {
			k := fmt.Appendf(nil, "chaos/etcd/%d/%02d", ci, j)
			owned[ci] = append(owned[ci], k)
			all = append(all, k)
		}
	}
	state := make([][]chaosOwned, clients)
	const deadline = 2*2*time.Second + time.Second
	var stop atomic.Bool
	var ops, exact, misses, named atomic.Int64
	var wg sync.WaitGroup
	fail := make(chan string, 16)
	report := func(format string, args ...any) {
		select {
		case fail <- fmt.Sprintf(format, args...):
		default:
		}
	}
	for ci := range clients {
		d := d1
		if ci%2 == 1 {
			d = d2
		}
		c := d.dial(t, fmt.Sprintf("chaos-etcd-%d", ci))
		state[ci] = make([]chaosOwned, perClient)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(ci), 11))
			st := state[ci]
			for !stop.Load() {
				op := rng.IntN(10)
				j := rng.IntN(perClient)
				k := owned[ci][j]
				if op < 4 {
					k = all[rng.IntN(len(all))]
				}
				want := clusterValue(k, chaosSize(k))
				start := time.Now()
				var err error
				what := "get"
				switch {
				case op < 4:
					var v []byte
					v, err = c.GetBytes(k)
					if err == nil {
						if !bytes.Equal(v, want) {
							report("get %s on %s: %d bytes that are not the value", k, d.cfg.DaemonID, len(v))
							return
						}
						exact.Add(1)
					}
				case op < 8:
					what = "put"
					err = c.PutBytes(k, want, true)
					switch {
					case err == nil, errors.Is(err, client.ErrAlreadyExists):
						st[j] = ownedPresent
					default:
						st[j] = ownedUnknown
					}
				default:
					what = "remove"
					res := make([]error, 1)
					if err = c.StoreRemove([][]byte{k}, res); err == nil {
						err = res[0]
					}
					if err == nil {
						st[j] = ownedAbsent
					} else {
						st[j] = ownedUnknown
					}
				}
				if took := time.Since(start); took > deadline {
					report("%s %s on %s answered after %v (%v)", what, k, d.cfg.DaemonID, took, err)
					return
				}
				ops.Add(1)
				switch {
				case err == nil:
				case errors.Is(err, client.ErrNotFound):
					misses.Add(1)
				case errors.Is(err, client.ErrUnavailable), errors.Is(err, client.ErrDeadlineExceeded),
					errors.Is(err, client.ErrBusy), errors.Is(err, client.ErrResourceExhausted),
					errors.Is(err, client.ErrAlreadyExists), errors.Is(err, client.ErrFailedPrecondition):
					named.Add(1)
				default:
					report("%s %s on %s: %v, not a named error", what, k, d.cfg.DaemonID, err)
					return
				}
			}
		}()
	}
	wait := paceFaults(t, fail, &stop, &wg)
	wait(time.Second)
	if err := child.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-child.exited
	wait(3 * time.Second)
	srv.Stop()
	wait(3 * time.Second) // past the staleness budget: the homes refuse (fail closed)
	srv.Restart()
	wait(3 * time.Second)
	stop.Store(true)
	wg.Wait()
	select {
	case msg := <-fail:
		t.Fatal(msg)
	default:
	}
	t.Logf("%d answers: %d exact gets, %d misses, %d named errors", ops.Load(), exact.Load(), misses.Load(), named.Load())
	if exact.Load() == 0 || ops.Load() < 100 {
		t.Fatalf("%d answers, %d exact gets: the clients did not run", ops.Load(), exact.Load())
	}

	// Settled: d3 is gone from etcd and its shards are claimed by d1 and d2.
	testutil.Eventually(t, 30*time.Second, claimedBy("d1", "d2"), "every shard claimed by d1 and d2")
	readers := []*client.Client{d1.dial(t, "check-d1"), d2.dial(t, "check-d2")}
	present, absent := 0, 0
	for ci := range clients {
		for j, k := range owned[ci] {
			want := clusterValue(k, chaosSize(k))
			for ri, c := range readers {
				switch state[ci][j] {
				case ownedPresent:
					var v []byte
					var err error
					testutil.Eventually(t, 10*time.Second, func() bool {
						v, err = c.GetBytes(k)
						return err == nil
					}, "acknowledged %s read on d%d (last: %v)", k, ri+1, testutil.Lazy(func() error { return err }))
					if !bytes.Equal(v, want) {
						t.Fatalf("acknowledged %s on d%d: %d bytes that are not the value", k, ri+1, len(v))
					}
					present++
				case ownedAbsent:
					var err error
					testutil.Eventually(t, 10*time.Second, func() bool {
						var v []byte
						v, err = c.GetBytes(k)
						if err == nil {
							t.Fatalf("removed %s served on d%d: %d bytes (stale)", k, ri+1, len(v))
						}
						return errors.Is(err, client.ErrNotFound)
					}, "removed %s a miss on d%d (last: %v)", k, ri+1, testutil.Lazy(func() error { return err }))
					absent++
				}
			}
		}
	}
	t.Logf("after the faults: %d reads of acknowledged keys exact, %d of removed keys misses", present, absent)
	if present == 0 || absent == 0 {
		t.Fatalf("%d acknowledged and %d removed keys checked: the clients did not write enough", present, absent)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return d1.d.cluster.Holds() == 0 && d2.d.cluster.Holds() == 0 },
		"holds released on d1 and d2")
	noPinsLeft(t, d1, d2)
}

// paceFaults is the chaos tests' pacing of their faults, not
// synchronization (the clients run throughout and every check is on their
// answers): the wait it returns ends after d, or stops the clients (stop,
// wg) and fails the test when one reports a failure on fail.
func paceFaults(t *testing.T, fail <-chan string, stop *atomic.Bool, wg *sync.WaitGroup) func(d time.Duration) {
	return func(d time.Duration) {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case msg := <-fail:
			stop.Store(true)
			wg.Wait()
			t.Fatal(msg)
		}
	}
}
