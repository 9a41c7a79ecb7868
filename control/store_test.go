package control

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// storeEnv is a server with a store over its pool: L1 only, or with an L2
// file through a real io_uring transport.
type storeEnv struct {
	*env
	s  *store.Store
	tr *uring.Transport
}

// requireUring skips, saying so, on a host without io_uring.
func requireUring(t *testing.T) {
	t.Helper()
	tr, err := uring.New(uring.Config{}, nil)
	testutil.RequireSupported(t, testutil.IOUring, err)
	tr.Close()
}

func newStoreEnv(t *testing.T, l2 bool, cfg store.Config) *storeEnv {
	t.Helper()
	return newStoreEnvWrapped(t, l2, cfg, nil)
}

// newStoreEnvWrapped is newStoreEnv; with wrap (and l2), the store's L2
// I/O goes through the transport wrap makes of the uring one.
func newStoreEnvWrapped(t *testing.T, l2 bool, cfg store.Config, wrap func(*uring.Transport) xfer.Transport) *storeEnv {
	t.Helper()
	if l2 {
		requireUring(t)
	}
	se := &storeEnv{}
	dir := t.TempDir()
	se.env = newEnv(t, false, func(c *Config, d *Deps) {
		pool := d.Pool.(*shm.Pool)
		var err error
		if l2 {
			if se.tr, err = uring.New(uring.Config{AllowedDirs: []string{dir}}, nil); err != nil {
				t.Fatal(err)
			}
			f := store.FileL2{Path: filepath.Join(dir, "l2.data"), Size: 64 << 20, RegionSize: 4 << 20, FileID: 100, StagingID: 101}
			if wrap == nil {
				se.s, err = store.Open(cfg, pool, se.tr, f)
			} else {
				se.s, err = openWrapped(t, cfg, pool, se.tr, wrap(se.tr), f)
			}
		} else {
			se.s, err = store.New(cfg, pool, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		d.Store = se.s
	})
	// This runs before the env's own cleanup: the server goes first (its
	// connections' sessions close), then the store, then its transport.
	t.Cleanup(func() {
		se.srv.Close()
		if err := se.s.Close(); err != nil {
			t.Errorf("store close: %v", err)
		}
		if se.tr != nil {
			se.tr.Close()
		}
	})
	return se
}

// openWrapped is store.Open with the store's L2 I/O through tr (a wrapper
// of u); the file is closed when the test ends.
func openWrapped(t *testing.T, cfg store.Config, pool *shm.Pool, u *uring.Transport, tr xfer.Transport, f store.FileL2) (*store.Store, error) {
	if err := u.RegisterBuffers(pool); err != nil {
		t.Logf("pool not registered as fixed buffers: %v", err)
	}
	file, err := u.OpenFile(f.FileID, f.Path, uring.FileOptions{Size: f.Size, Create: true})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { file.Close() })
	return store.New(cfg, pool, &store.L2{Transport: tr, File: file, StagingID: f.StagingID, RegionSize: f.RegionSize})
}

// gatedL2 holds the tasks submitted while it is shut and submits them
// when it opens: a test decides when the store's L2 I/O starts.
type gatedL2 struct {
	*uring.Transport
	mu   sync.Mutex
	shut bool
	held [][]*xfer.Task
}

func (g *gatedL2) Submit(tasks []*xfer.Task) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut {
		g.held = append(g.held, slices.Clone(tasks))
		return len(tasks), nil
	}
	return g.Transport.Submit(tasks)
}

func (g *gatedL2) hold() {
	g.mu.Lock()
	g.shut = true
	g.mu.Unlock()
}

// open submits what it held, in order, and lets what follows through.
func (g *gatedL2) open() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut = false
	for _, ts := range g.held {
		if n, err := g.Transport.Submit(ts); err != nil || n != len(ts) {
			return fmt.Errorf("submit of held tasks: %d of %d, %v", n, len(ts), err)
		}
	}
	g.held = nil
	return nil
}

func keysOf(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte(fmt.Sprintf("%s-%04d", prefix, i))
	}
	return out
}

// wantResults checks positional results against codes.
func wantResults(t *testing.T, what string, got []error, want ...wire.Code) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d results, want %d", what, len(got), len(want))
	}
	for i, w := range want {
		var se *client.StatusError
		switch {
		case w == tcproto.CodeOK && got[i] != nil:
			t.Errorf("%s: key %d: %v, want OK", what, i, got[i])
		case w != tcproto.CodeOK && (!errors.As(got[i], &se) || se.Code != w):
			t.Errorf("%s: key %d: %v, want %s", what, i, got[i], w)
		}
	}
}

// TestStoreSocketCalls runs every socket store call with positional
// results, refusals included, on one connection.
func TestStoreSocketCalls(t *testing.T) {
	e := newStoreEnv(t, false, store.Config{})
	c, err := client.Dial(e.sock, client.Options{Name: "store-socket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf, err := c.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf.Mem {
		buf.Mem[i] = byte(i * 13)
	}
	blocks, err := c.AllocBlocks(nil, 1, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	copy(c.PoolBytes()[blocks[0]:], "from a pool block")
	keys := keysOf("sock", 5)
	res := make([]error, 5)
	// Values from the buffer, from a pool block this connection holds, and
	// three refused extents: an unknown segment, a pool range it does not
	// hold, an empty one.
	vals := []client.Extent{{Segment: buf.ID, Offset: 0, Length: 1000}, {Segment: testPoolID, Offset: blocks[0], Length: 17},
		{Segment: 999, Length: 10}, {Segment: testPoolID, Offset: blocks[0] + 64<<10, Length: 10}, {Segment: buf.ID, Length: 0}}
	if err := c.StorePut(keys, vals, false, res); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "put", res, tcproto.CodeOK, tcproto.CodeOK, tcproto.CodeNOT_FOUND, tcproto.CodePERMISSION_DENIED, tcproto.CodeINVALID_ARGUMENT)
	if err := c.StorePut(keys[:1], vals[:1], false, res[:1]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "put again", res[:1], tcproto.CodeALREADY_EXISTS)

	// Read back into the buffer's second half; a short destination gets
	// INVALID_ARGUMENT and the value's length.
	dests := []client.Extent{{Segment: buf.ID, Offset: 512 << 10, Length: 4096}, {Segment: buf.ID, Offset: 600 << 10, Length: 4096},
		{Segment: buf.ID, Offset: 700 << 10, Length: 4096}, {Segment: buf.ID, Offset: 0, Length: 999}}
	lens := make([]uint64, 4)
	rk := [][]byte{keys[0], keys[1], keys[2], keys[0]}
	if err := c.StoreRead(rk, dests, lens, res[:4]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "read", res[:4], tcproto.CodeOK, tcproto.CodeOK, tcproto.CodeNOT_FOUND, tcproto.CodeINVALID_ARGUMENT)
	if lens[0] != 1000 || lens[1] != 17 || lens[2] != 0 || lens[3] != 1000 {
		t.Fatalf("lengths %v", lens)
	}
	if !bytes.Equal(buf.Mem[512<<10:512<<10+1000], buf.Mem[:1000]) || string(buf.Mem[600<<10:600<<10+17]) != "from a pool block" {
		t.Fatal("values read back differ from those put")
	}
	if v, err := c.GetBytes(keys[1]); err != nil || string(v) != "from a pool block" {
		t.Fatalf("GetBytes: %q %v", v, err)
	}
	if err := c.PutBytes([]byte("small"), []byte("hello"), false); err != nil {
		t.Fatal(err)
	}
	if v, err := c.GetBytes([]byte("small")); err != nil || string(v) != "hello" {
		t.Fatalf("GetBytes after PutBytes: %q %v", v, err)
	}

	// Pin is all or nothing: an absent key refuses the whole batch.
	if err := c.StorePin([][]byte{keys[0], keys[2]}, 0, res[:2]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "pin with an absent key", res[:2], tcproto.CodeFAILED_PRECONDITION, tcproto.CodeNOT_FOUND)
	if in, err := c.StoreStat(keys[0]); err != nil || in.Pins != 0 || in.Size != 1000 || !in.InL1 || in.InL2 {
		t.Fatalf("stat after a refused pin: %+v %v", in, err)
	}
	if err := c.StorePin(keys[:2], time.Hour, res[:2]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "pin", res[:2], tcproto.CodeOK, tcproto.CodeOK)
	if err := c.StoreRemove(keys[:3], res[:3]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "remove pinned", res[:3], tcproto.CodeFAILED_PRECONDITION, tcproto.CodeFAILED_PRECONDITION, tcproto.CodeOK)
	if err := c.StoreUnpin(keys[:2], res[:2]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "unpin", res[:2], tcproto.CodeOK, tcproto.CodeOK)
	if err := c.StoreUnpin(keys[:2], res[:2]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "unpin below zero", res[:2], tcproto.CodeFAILED_PRECONDITION, tcproto.CodeFAILED_PRECONDITION)

	// Zero-copy put on the socket: reserve, write in place, commit.
	zk := keysOf("zc", 3)
	offs := make([]uint64, 3)
	if err := c.StoreReserve(zk, []uint64{4096, 1 << 30, 100}, offs, res[:3]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "reserve", res[:3], tcproto.CodeOK, tcproto.CodeINVALID_ARGUMENT, tcproto.CodeOK)
	copy(c.PoolBytes()[offs[0]:], bytes.Repeat([]byte{7}, 4096))
	if err := c.StoreCommit(zk, false, res[:3]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "commit", res[:3], tcproto.CodeOK, tcproto.CodeFAILED_PRECONDITION, tcproto.CodeOK)
	if err := c.StoreCommit(zk[:1], true, res[:1]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "durable commit without L2", res[:1], tcproto.CodeALREADY_EXISTS)
	if v, err := c.GetBytes(zk[0]); err != nil || !bytes.Equal(v, bytes.Repeat([]byte{7}, 4096)) {
		t.Fatalf("zero-copy value: %d bytes %v", len(v), err)
	}

	// List pages in order; Stat of an absent key is NOT_FOUND.
	var all [][]byte
	var after []byte
	for {
		ks, more, err := c.StoreList([]byte("sock-"), after, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			all = append(all, k.Key)
		}
		if !more {
			break
		}
		after = ks[len(ks)-1].Key
	}
	if len(all) != 2 || !bytes.Equal(all[0], keys[0]) || !bytes.Equal(all[1], keys[1]) {
		t.Fatalf("listed %q", all)
	}
	if _, err := c.StoreStat([]byte("absent")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("stat absent: %v", err)
	}
	if err := c.StoreFlush(time.Second); err != nil {
		t.Fatalf("flush without L2: %v", err)
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, k := range st.Store {
		got[k.Name] = k.Value
	}
	if got["keys"] != 5 || got["pins"] != 0 || got["l1_capacity"] == 0 {
		t.Fatalf("store counters %v", got)
	}
}

// TestStoreSessionReleased: what a connection holds in the store (pins,
// leases, reservations) goes when it closes.
func TestStoreSessionReleased(t *testing.T) {
	e := newStoreEnv(t, false, store.Config{})
	c, err := client.Dial(e.sock, client.Options{Name: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PutBytes([]byte("held"), []byte("v"), false); err != nil {
		t.Fatal(err)
	}
	res := make([]error, 1)
	c.StorePin([][]byte{[]byte("held")}, 0, res)
	c.StorePin([][]byte{[]byte("held")}, time.Hour, res)
	offs := make([]uint64, 1)
	c.StoreReserve([][]byte{[]byte("reserved")}, []uint64{4096}, offs, res)
	if st := e.s.Stats(); st.Pins != 2 || st.Reserved != 1 {
		t.Fatalf("before close: %d pins, %d reserved", st.Pins, st.Reserved)
	}
	c.Close()
	testutil.Eventually(t, testTimeout, func() bool { st := e.s.Stats(); return st.Pins == 0 && st.Reserved == 0 && e.srv.Connections() == 0 },
		"the closed client's pins and reservations released and its connection gone: %+v, %d connections",
		testutil.Lazy(e.s.Stats), testutil.Lazy(e.srv.Connections))
	c2, err := client.Dial(e.sock, client.Options{Name: "after"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := c2.StoreRemove([][]byte{[]byte("held")}, res); err != nil || res[0] != nil {
		t.Fatalf("remove after the holder left: %v %v", err, res[0])
	}
}

// TestStoreUnavailable: a daemon without a store answers its calls
// UNAVAILABLE, on the socket and on a queue.
func TestStoreUnavailable(t *testing.T) {
	e := newEnv(t, false)
	c, q := queueClient(t, e, 8)
	if err := c.StoreRemove([][]byte{[]byte("k")}, make([]error, 1)); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("socket call: %v", err)
	}
	res, err := c.NewResults(4)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := q.Exists([][]byte{[]byte("k")}, res, 1); !ok || err != nil {
		t.Fatal(ok, err)
	}
	cq := reapAll(t, q, 1)[1]
	if cq.Code != tcproto.CodeUNAVAILABLE || !errors.Is(res.Check(cq), client.ErrUnavailable) {
		t.Fatalf("queue op: %+v", cq)
	}
}

// TestStoreAbortOnSocket: Abort on the control socket answers one code
// per key (OK for the connection's reservation, FAILED_PRECONDITION for
// another connection's, which it leaves alone), and a batch over the
// store's key limit is refused whole with INVALID_ARGUMENT, as Commit is.
func TestStoreAbortOnSocket(t *testing.T) {
	e := newStoreEnv(t, false, store.Config{MaxKeysPerCall: 4})
	a, err := client.Dial(e.sock, client.Options{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := client.Dial(e.sock, client.Options{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	res := make([]error, 5)
	offs := make([]uint64, 1)
	if err := a.StoreReserve([][]byte{[]byte("ra")}, []uint64{4096}, offs, res[:1]); err != nil || res[0] != nil {
		t.Fatalf("reserve: %v %v", err, res[0])
	}
	if err := b.StoreReserve([][]byte{[]byte("rb")}, []uint64{4096}, offs, res[:1]); err != nil || res[0] != nil {
		t.Fatalf("reserve: %v %v", err, res[0])
	}
	five := keysOf("x", 5)
	if err := a.StoreCommit(five, false, res); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("commit of 5 keys (limit 4): %v", err)
	}
	if err := a.StoreAbort(five, res); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("abort of 5 keys (limit 4): %v", err)
	}
	if err := a.StoreAbort([][]byte{[]byte("rb"), []byte("ra")}, res[:2]); err != nil {
		t.Fatal(err)
	}
	wantResults(t, "abort", res[:2], tcproto.CodeFAILED_PRECONDITION, tcproto.CodeOK)
	if st := e.s.Stats(); st.Reserved != 1 || st.Aborted != 1 {
		t.Fatalf("store stats %+v", st)
	}
	if err := b.StoreCommit([][]byte{[]byte("rb")}, false, res[:1]); err != nil || res[0] != nil {
		t.Fatalf("b's commit after a's abort: %v %v", err, res[0])
	}
}
