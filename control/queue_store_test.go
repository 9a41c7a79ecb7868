package control

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testhook"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// qcall submits one store call on q and returns its checked
// completion.
func qcall(t *testing.T, q *client.Queue, res *client.Results, ud uint64, submit func() (bool, error)) (client.Completion, error) {
	t.Helper()
	ok, err := submit()
	if !ok || err != nil {
		t.Fatalf("submit %d: %v %v", ud, ok, err)
	}
	cq := reapAll(t, q, 1)[ud]
	if cq.UserData != ud {
		t.Fatalf("completion %+v for %d", cq, ud)
	}
	if res == nil {
		return cq, nil
	}
	return cq, res.Check(cq)
}

// pattern is byte j of test value i.
func pattern(i, j int) byte { return byte(i + j*3) }

// wantCodes checks a Results against codes.
func wantCodes(t *testing.T, what string, res *client.Results, want ...wire.Code) {
	t.Helper()
	if res.Len() != len(want) {
		t.Fatalf("%s: %d results, want %d", what, res.Len(), len(want))
	}
	for i, w := range want {
		if res.Code(i) != w {
			t.Errorf("%s: key %d: %s, want %s", what, i, res.Code(i), w)
		}
	}
}

// TestStoreQueueOps runs every store op of the queue with positional
// codes, against a store with an L2 file: a zero-copy put (Reserve,
// write in place, durable Commit), Exists, LookupPrefix with pin, Get and
// its release, an unpin below zero refused all or nothing, and a Get of a
// value only on L2, whose completion comes once it has been read back.
func TestStoreQueueOps(t *testing.T) {
	// The whole L1 may be one session's reservations: the test fills it.
	e := newStoreEnv(t, true, store.Config{L1Capacity: 1 << 20, MaxSessionReserved: 1 << 20})
	c, q := queueClient(t, e.env, 32)
	res, err := c.NewResults(64)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 10
	keys := keysOf("q", 8)
	cq, err := qcall(t, q, res, 1, func() (bool, error) { return q.Reserve(keys, size, res, 1) })
	if err != nil || cq.N != 8 {
		t.Fatalf("reserve: %v %+v", err, cq)
	}
	for i := range keys {
		v := res.Value(i)
		if off, l := res.Location(i); len(v) != size || l != size || off%4096 != 0 {
			t.Fatalf("reserved %d at %d: %d bytes", i, off, len(v))
		}
		for j := range v {
			v[j] = pattern(i, j)
		}
	}
	ck := append(keys[:8:8], []byte("never-reserved"))
	cq, err = qcall(t, q, res, 2, func() (bool, error) { return q.Commit(ck, true, res, 2) })
	if err != nil || cq.N != 8 || cq.State != xfer.StateCompleted {
		t.Fatalf("durable commit: %v %+v", err, cq)
	}
	wantCodes(t, "commit", res, tcproto.CodeOK, tcproto.CodeOK, tcproto.CodeOK, tcproto.CodeOK, tcproto.CodeOK, tcproto.CodeOK,
		tcproto.CodeOK, tcproto.CodeOK, tcproto.CodeFAILED_PRECONDITION)
	if in, err := c.StoreStat(keys[3]); err != nil || !in.InL2 || in.Size != size {
		t.Fatalf("a durable commit is not on L2: %+v %v", in, err)
	}
	cq, err = qcall(t, q, res, 3, func() (bool, error) { return q.Commit(keys[:1], false, res, 3) })
	if err != nil || cq.N != 0 {
		t.Fatalf("commit again: %v %+v", err, cq)
	}
	wantCodes(t, "commit again", res, tcproto.CodeALREADY_EXISTS)

	ek := [][]byte{keys[0], []byte("absent"), keys[7], {}}
	cq, err = qcall(t, q, res, 4, func() (bool, error) { return q.Exists(ek, res, 4) })
	if err != nil || cq.N != 2 {
		t.Fatalf("exists: %v %+v", err, cq)
	}
	wantCodes(t, "exists", res, tcproto.CodeOK, tcproto.CodeNOT_FOUND, tcproto.CodeOK, tcproto.CodeINVALID_ARGUMENT)

	chain := [][]byte{keys[0], keys[1], keys[2], keys[3], []byte("absent"), keys[5]}
	cq, _ = qcall(t, q, nil, 5, func() (bool, error) { return q.LookupPrefix(chain, false, 5) })
	if cq.Code != tcproto.CodeOK || cq.N != 4 || e.s.Stats().Pins != 0 {
		t.Fatalf("lookup prefix: %+v, %d pins", cq, e.s.Stats().Pins)
	}
	cq, _ = qcall(t, q, nil, 6, func() (bool, error) { return q.LookupPrefix(chain, true, 6) })
	if cq.Code != tcproto.CodeOK || cq.N != 4 || e.s.Stats().Pins != 4 {
		t.Fatalf("lookup prefix with pin: %+v, %d pins", cq, e.s.Stats().Pins)
	}
	cq, err = qcall(t, q, res, 7, func() (bool, error) { return q.Unpin(chain[:4], res, 7) })
	if err != nil || cq.N != 4 || e.s.Stats().Pins != 0 {
		t.Fatalf("unpin the prefix: %v %+v, %d pins", err, cq, e.s.Stats().Pins)
	}

	gk := [][]byte{keys[6], []byte("absent"), keys[7]}
	cq, err = qcall(t, q, res, 8, func() (bool, error) { return q.Get(gk, res, 8) })
	if err != nil || cq.N != 2 {
		t.Fatalf("get: %v %+v", err, cq)
	}
	wantCodes(t, "get", res, tcproto.CodeOK, tcproto.CodeNOT_FOUND, tcproto.CodeOK)
	for i, k := range []int{6, -1, 7} {
		v := res.Value(i)
		if k < 0 {
			if v != nil {
				t.Fatal("an absent key has a value")
			}
			continue
		}
		if len(v) != size || v[0] != pattern(k, 0) || v[size-1] != pattern(k, size-1) {
			t.Fatalf("get %d: %d bytes, wrong values", k, len(v))
		}
	}
	rel := [][]byte{keys[6], keys[7]}
	if cq, err = qcall(t, q, res, 9, func() (bool, error) { return q.Unpin(rel, res, 9) }); err != nil || cq.N != 2 {
		t.Fatalf("release: %v %+v", err, cq)
	}
	cq, err = qcall(t, q, res, 10, func() (bool, error) { return q.Unpin(rel, res, 10) })
	if !errors.Is(err, client.ErrFailedPrecondition) || cq.Code != tcproto.CodeFAILED_PRECONDITION || cq.N != 0 {
		t.Fatalf("unpin below zero: %v %+v", err, cq)
	}
	wantCodes(t, "unpin below zero", res, tcproto.CodeFAILED_PRECONDITION, tcproto.CodeFAILED_PRECONDITION)
	// A key that is not stored refuses the whole batch too: the call's code
	// is FAILED_PRECONDITION (nothing changed), the key's own says why.
	absent := [][]byte{[]byte("never stored"), keys[6]}
	cq, err = qcall(t, q, res, 11, func() (bool, error) { return q.Unpin(absent, res, 11) })
	if cq.Code != tcproto.CodeFAILED_PRECONDITION || cq.N != 0 {
		t.Fatalf("unpin of an absent key: %v %+v, want the batch refused with FAILED_PRECONDITION", err, cq)
	}
	wantCodes(t, "unpin of an absent key", res, tcproto.CodeNOT_FOUND, tcproto.CodeFAILED_PRECONDITION)

	// Fill L1 (1 MiB) with durable puts until keys[0] is only on L2, then
	// Get it: a promotion, read back into the pool with its exact bytes.
	for round := 0; ; round++ {
		if in, err := c.StoreStat(keys[0]); err != nil {
			t.Fatal(err)
		} else if !in.InL1 {
			break
		}
		if round == 64 {
			t.Fatal("keys[0] still in L1 after 64 rounds of puts")
		}
		more := keysOf(fmt.Sprintf("fill%d", round), 4)
		if _, err := qcall(t, q, res, 100, func() (bool, error) { return q.Reserve(more, size, res, 100) }); err != nil {
			t.Fatal(err)
		}
		if _, err := qcall(t, q, res, 101, func() (bool, error) { return q.Commit(more, true, res, 101) }); err != nil {
			t.Fatal(err)
		}
	}
	before := e.s.Stats().Promotions
	cq, err = qcall(t, q, res, 11, func() (bool, error) { return q.Get(keys[:1], res, 11) })
	if err != nil || cq.N != 1 {
		t.Fatalf("get of an L2-only value: %v %+v", err, cq)
	}
	if v := res.Value(0); len(v) != size || v[1] != pattern(0, 1) || v[size-1] != pattern(0, size-1) {
		t.Fatal("promoted value differs")
	}
	if e.s.Stats().Promotions != before+1 {
		t.Fatalf("promotions %d, want %d", e.s.Stats().Promotions, before+1)
	}
	qcall(t, q, res, 12, func() (bool, error) { return q.Unpin(keys[:1], res, 12) })
}

// rawStoreQueue is a queue mapped by the test itself, with a results
// buffer, so that it can write any SQE.
type rawStoreQueue struct {
	rc   *rawClient
	ring *queue.ClientRing
	mem  []byte // the queue's mapping
	buf  xfer.SegmentID
	bmem []byte // the results buffer
}

func openRawStoreQueue(t *testing.T, e *env) *rawStoreQueue {
	t.Helper()
	rq := &rawStoreQueue{rc: dialRaw(t, e.sock)}
	fd, err := shm.NewMemfd("results", 1<<16, true)
	if err != nil {
		t.Fatal(err)
	}
	if rq.bmem, err = shm.MapShared(fd, 1<<16); err != nil {
		t.Fatal(err)
	}
	r := rq.rc.call(&wire.RegisterBufferRequest{Size: 1 << 16}, fd)
	unix.Close(fd)
	rq.buf = xfer.SegmentID(body[wire.RegisterBufferResponse](t, r).Segment)
	r, fds := rq.rc.callFD(&wire.OpenQueueRequest{SQEntries: 16, DataSize: 8192})
	if r.Status != tcproto.CodeOK || len(fds) != 1 {
		t.Fatalf("open queue: %s, %d fds", r.Status, len(fds))
	}
	size := body[wire.OpenQueueResponse](t, r).Size
	rq.mem, err = shm.MapShared(fds[0], size)
	closeFDs(fds)
	if err != nil {
		t.Fatal(err)
	}
	if rq.ring, err = queue.NewClientRing(rq.mem); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rq.rc.uc.Close()
		shm.Unmap(rq.mem)
		shm.Unmap(rq.bmem)
	})
	return rq
}

// submit stages e with data as its key list, or as it is when e names a
// data range of its own, and returns its CQE.
func (rq *rawStoreQueue) submit(t *testing.T, e queue.SQE, data []byte) queue.CQE {
	t.Helper()
	if e.NotifyOff != 0 || e.NotifyLen != 0 {
		if ok, err := rq.ring.Stage(&e, nil); !ok || err != nil {
			t.Fatalf("stage: %v %v", ok, err)
		}
	} else {
		d, ok, err := rq.ring.StageData(&e, len(data))
		if !ok || err != nil {
			t.Fatalf("stage: %v %v", ok, err)
		}
		copy(d, data)
	}
	rq.ring.Submit()
	if err := rq.ring.Wait(1, testTimeout); err != nil {
		t.Fatal(err)
	}
	var cq [1]queue.CQE
	if rq.ring.Reap(cq[:]) != 1 || cq[0].UserData != e.UserData {
		t.Fatalf("reaped %+v for %d", cq[0], e.UserData)
	}
	return cq[0]
}

// TestStoreQueueRefusals: every malformed store SQE gets one CQE with its
// code, and the results region is left as it was.
func TestStoreQueueRefusals(t *testing.T) {
	e := newStoreEnv(t, false, store.Config{MaxKeysPerCall: 8})
	rq := openRawStoreQueue(t, e.env)
	two := wire.AppendKeys(nil, [][]byte{[]byte("a"), []byte("bb")})
	three := wire.AppendKeys(nil, [][]byte{[]byte("a"), []byte("bb"), []byte("c")})
	good := queue.SQE{Op: queue.OpStoreExists, Count: 2, Local: uint64(rq.buf), LocalOff: 64}
	with := func(f func(*queue.SQE)) queue.SQE { s := good; f(&s); return s }
	for i, tc := range []struct {
		name string
		e    queue.SQE
		data []byte
		want wire.Code
	}{
		{"unknown op", with(func(s *queue.SQE) { s.Op = 30 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"flag on exists", with(func(s *queue.SQE) { s.Flags = queue.SQEFlagDurable }), two, tcproto.CodeINVALID_ARGUMENT},
		{"notify flag", with(func(s *queue.SQE) { s.Flags = queue.SQEFlagNotify }), two, tcproto.CodeINVALID_ARGUMENT},
		{"no keys", with(func(s *queue.SQE) { s.Count = 0 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"more keys than the store takes", with(func(s *queue.SQE) { s.Count = 9 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"target set", with(func(s *queue.SQE) { s.Target = 1 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"length on exists", with(func(s *queue.SQE) { s.Length = 4096 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"results in the pool", with(func(s *queue.SQE) { s.Local = uint64(testPoolID) }), two, tcproto.CodeINVALID_ARGUMENT},
		{"results in no segment", with(func(s *queue.SQE) { s.Local = 999 }), two, tcproto.CodeNOT_FOUND},
		{"results misaligned", with(func(s *queue.SQE) { s.LocalOff = 68 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"results past the buffer", with(func(s *queue.SQE) { s.LocalOff = 1<<16 - 16 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"results offset wraps", with(func(s *queue.SQE) { s.LocalOff = 1<<64 - 8 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"more keys than counted", good, three, tcproto.CodeINVALID_ARGUMENT},
		{"fewer keys than counted", with(func(s *queue.SQE) { s.Count = 3 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"a key running past the list", good, two[:len(two)-1], tcproto.CodeINVALID_ARGUMENT},
		{"list outside the data area", with(func(s *queue.SQE) { s.NotifyOff, s.NotifyLen = 8190, 7 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"list longer than the data area", with(func(s *queue.SQE) { s.NotifyOff, s.NotifyLen = 0, 1<<20 }), two, tcproto.CodeINVALID_ARGUMENT},
		{"lookup with results", with(func(s *queue.SQE) { s.Op = queue.OpStoreLookupPrefix }), two, tcproto.CodeINVALID_ARGUMENT},
		{"lookup with the durable flag", with(func(s *queue.SQE) {
			s.Op, s.Flags, s.Local, s.LocalOff = queue.OpStoreLookupPrefix, queue.SQEFlagDurable, 0, 0
		}), two, tcproto.CodeINVALID_ARGUMENT},
	} {
		for j := range rq.bmem {
			rq.bmem[j] = 0xaa
		}
		tc.e.UserData = uint64(i + 1)
		cq := rq.submit(t, tc.e, tc.data)
		if cq.Code != uint32(tc.want) || cq.State != uint8(xfer.StateFailed) || cq.Result != 0 {
			t.Errorf("%s: CQE %+v, want code %s", tc.name, cq, tc.want)
		}
		if bytes.Count(rq.bmem, []byte{0xaa}) != len(rq.bmem) {
			t.Errorf("%s: the results buffer was written", tc.name)
		}
	}
	// The same queue still serves a good call.
	cq := rq.submit(t, with(func(s *queue.SQE) { s.UserData = 100 }), two)
	if cq.Code != 0 || cq.Result != 0 {
		t.Fatalf("good call: %+v", cq)
	}
	for i := 0; i < 2; i++ {
		if code, _, _, ok := queue.StoreResult(rq.bmem[64+16*i:]); code != uint8(tcproto.CodeNOT_FOUND) || !ok {
			t.Fatalf("record %d: code %d ok %v", i, code, ok)
		}
	}
}

// TestStoreQueueHostileKeys: another process rewrites its queue's data
// area at random while its store ops run, so the daemon reads key lists
// that change under it. The daemon copies each list before it looks at a
// byte: it keeps serving (this test's own client sees exact values
// throughout), every entry the store holds is found again by its own key,
// and when the scribbler is killed all it held goes.
func TestStoreQueueHostileKeys(t *testing.T) {
	e := newStoreEnv(t, false, store.Config{})
	cmd, out := startHelper(t, e.env, "store-scribble")
	waitLine(t, out, "scribbling")
	c, q := queueClient(t, e.env, 16)
	res, err := c.NewResults(8)
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 200; round++ {
		k := []byte(fmt.Sprintf("mine-%03d", round))
		v := bytes.Repeat([]byte{byte(round)}, 100+round)
		if err := c.PutBytes(k, v, false); err != nil {
			t.Fatalf("round %d: put: %v", round, err)
		}
		if got, err := c.GetBytes(k); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("round %d: get: %v", round, err)
		}
		cq, err := qcall(t, q, res, uint64(round), func() (bool, error) { return q.Exists([][]byte{k, []byte("mine-none")}, res, uint64(round)) })
		if err != nil || cq.N != 1 || res.Code(0) != tcproto.CodeOK || res.Code(1) != tcproto.CodeNOT_FOUND {
			t.Fatalf("round %d: exists: %v %+v", round, err, cq)
		}
	}
	cmd.Process.Signal(unix.SIGKILL)
	cmd.Wait()
	testutil.Eventually(t, testTimeout, func() bool { st := e.s.Stats(); return st.Pins == 0 && st.Reserved == 0 && e.srv.Connections() == 1 },
		"the killed client's pins and reservations released and its connection gone: %+v, %d connections",
		testutil.Lazy(e.s.Stats), testutil.Lazy(e.srv.Connections))
	var after []byte
	n := 0
	for {
		ks, more, err := c.StoreList(nil, after, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			if in, err := c.StoreStat(k.Key); err != nil || in.Size != k.Size {
				t.Fatalf("listed key %q is not found by itself: %+v %v", k.Key, in, err)
			}
			n++
		}
		if !more {
			break
		}
		after = ks[len(ks)-1].Key
	}
	if n < 200 {
		t.Fatalf("%d keys listed, at least this client's 200 expected", n)
	}
	if strings.Contains(e.logBuf.String(), "panic") {
		t.Fatal("the daemon panicked serving the scribbler")
	}
	t.Logf("%d keys in the store after the scribbler", n)
}

// runStoreHelper is the body of the store helper clients.
func runStoreHelper(kind string) int {
	if kind != "store-scribble" {
		fmt.Println("error unknown helper", kind)
		return 2
	}
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Getenv("TENSORCAST_TEST_SOCKET"), Net: "unix"})
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	rc := &rawClient{t: helperTB{}, uc: uc, b: flatbuffers.NewBuilder(256), oob: make([]byte, unix.CmsgSpace(32))}
	fd, err := shm.NewMemfd("results", 1<<16, true)
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	r := rc.call(&wire.RegisterBufferRequest{Size: 1 << 16}, fd)
	buf := body[wire.RegisterBufferResponse](rc.t, r).Segment
	r, fds := rc.callFD(&wire.OpenQueueRequest{SQEntries: 64, DataSize: 1 << 16})
	if r.Status != tcproto.CodeOK || len(fds) != 1 {
		fmt.Println("error open queue", r.Status, len(fds))
		return 2
	}
	mem, err := shm.MapShared(fds[0], body[wire.OpenQueueResponse](rc.t, r).Size)
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	ring, err := queue.NewClientRing(mem)
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	g := ring.Geometry()
	data := mem[g.DataOff : g.DataOff+g.DataSize]
	go func() {
		// Rewrite the data area all the time: key bytes, and the lengths
		// before them, at random.
		rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 11))
		for {
			i := rng.IntN(len(data))
			data[i] = byte(rng.Uint32())
			if rng.IntN(8) == 0 {
				data[i] = byte(rng.IntN(12)) // a plausible length
			}
		}
	}()
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 12))
	ops := []uint8{queue.OpStoreReserve, queue.OpStoreCommit, queue.OpStoreGet, queue.OpStoreExists, queue.OpStoreLookupPrefix, queue.OpStoreUnpin}
	var cqes [64]queue.CQE
	keys := make([][]byte, 8)
	reaped := 0
	said := false
	for i := uint64(0); ; i++ {
		n := 1 + rng.IntN(8)
		for j := range keys[:n] {
			keys[j] = []byte(fmt.Sprintf("hostile-%d", rng.IntN(32)))
		}
		e := queue.SQE{Op: ops[rng.IntN(len(ops))], Count: uint16(n), UserData: i, Local: buf, LocalOff: uint64(rng.IntN(64)) * 1024}
		switch e.Op {
		case queue.OpStoreReserve:
			e.Length = 4096
		case queue.OpStoreLookupPrefix:
			e.Local, e.LocalOff = 0, 0
			if rng.IntN(2) == 0 {
				e.Flags = queue.SQEFlagPin
			}
		}
		for ring.Space() == 0 {
			ring.Wait(1, 100*time.Millisecond)
			reaped += ring.Reap(cqes[:])
		}
		d, ok, err := ring.StageData(&e, wire.KeysLen(keys[:n]))
		if ok && err == nil {
			wire.PutKeys(d, keys[:n])
		}
		ring.Submit()
		reaped += ring.Reap(cqes[:])
		if reaped > 100 && !said {
			fmt.Println("scribbling")
			said = true
		}
	}
}

// TestStoreQueueAllocations: the hot store ops on a queue, Reserve,
// Commit, Get and its release, Exists and LookupPrefix, make no allocation
// on either side in the steady state.
func TestStoreQueueAllocations(t *testing.T) {
	e := newStoreEnv(t, false, store.Config{})
	c, q := queueClient(t, e.env, 64)
	res, err := c.NewResults(128)
	if err != nil {
		t.Fatal(err)
	}
	keys := keysOf("alloc", 128)
	cqes := make([]client.Completion, 4)
	one := func(submit func() (bool, error), want uint64) {
		if ok, err := submit(); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if n, err := q.Reap(cqes, 1, testTimeout); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		if err := res.Check(cqes[0]); err != nil || cqes[0].N != want {
			t.Fatal(err, cqes[0])
		}
	}
	put := keysOf("alloc-put", 1)
	rmCodes := make([]store.Code, 1)
	round := func() {
		one(func() (bool, error) { return q.Reserve(put, 4096, res, 1) }, 1)
		one(func() (bool, error) { return q.Commit(put, false, res, 2) }, 1)
		one(func() (bool, error) { return q.Get(keys, res, 3) }, 128)
		one(func() (bool, error) { return q.Unpin(keys, res, 4) }, 128)
		one(func() (bool, error) { return q.Exists(keys, res, 5) }, 128)
		if ok, err := q.LookupPrefix(keys, true, 6); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if n, err := q.Reap(cqes, 1, testTimeout); n != 1 || err != nil || cqes[0].N != 128 {
			t.Fatal(n, err, cqes[0])
		}
		one(func() (bool, error) { return q.Unpin(keys, res, 7) }, 128)
		e.s.Remove(put, rmCodes, nil, nil, 0)
	}
	for i := range keys {
		if err := c.PutBytes(keys[i], []byte("v"), false); err != nil {
			t.Fatal(err)
		}
	}
	for range 50 {
		round() // warm the records, the store's free lists, the rings
	}
	// The daemon runs in this process, so the count covers both sides.
	if a := testing.AllocsPerRun(200, round); a != 0 {
		t.Errorf("%v allocations per round of 7 store ops, client and daemon", a)
	}
}

// TestStoreQueuePendingAnsweredAfterPublish: a pending call (a durable
// commit) that completes while the worker still holds the entries it took
// (sq_head not yet published) is answered only once sq_head is: a client
// that reaped it first would find the entry's slot still taken.
func TestStoreQueuePendingAnsweredAfterPublish(t *testing.T) {
	// The commit's L2 writes are held until the worker has taken it, so
	// that it goes pending (I/O that finished inside the call would
	// answer it synchronously) and completes before sq_head is published.
	var gate *gatedL2
	e := newStoreEnvWrapped(t, true, store.Config{L1Capacity: 1 << 20}, func(u *uring.Transport) xfer.Transport {
		gate = &gatedL2{Transport: u}
		return gate
	})
	c, q := queueClient(t, e.env, 32)
	res, err := c.NewResults(4)
	if err != nil {
		t.Fatal(err)
	}
	keys := keysOf("held", 1)
	if cq, err := qcall(t, q, res, 1, func() (bool, error) { return q.Reserve(keys, 4096, res, 1) }); err != nil || cq.N != 1 {
		t.Fatalf("reserve: %v %+v", err, cq)
	}
	copy(res.Value(0), "held value")

	inPrepare, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{}, 1)
	var armed atomic.Bool
	var openErr error
	armed.Store(true)
	beforePublish := func() {
		if armed.CompareAndSwap(true, false) {
			openErr = gate.open()
			close(inPrepare)
			<-release
		}
	}
	storeDone := func() {
		select {
		case done <- struct{}{}:
		default:
		}
	}
	testhook.QueuePublish.Store(&beforePublish)
	testhook.StoreDone.Store(&storeDone)
	t.Cleanup(func() { testhook.QueuePublish.Store(nil); testhook.StoreDone.Store(nil) })
	unblocked := false
	defer func() {
		if !unblocked {
			close(release)
		}
	}()

	gate.hold()
	if ok, err := q.Commit(keys, true, res, 2); !ok || err != nil {
		t.Fatalf("submit the durable commit: %v %v", ok, err)
	}
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(testTimeout):
			t.Fatalf("%s within %v", what, testTimeout)
		}
	}
	wait(inPrepare, "the worker took the commit")
	if openErr != nil {
		t.Fatal(openErr)
	}
	wait(done, "the durable commit went pending and completed")
	cqes := make([]client.Completion, 4)
	if n, err := q.Reap(cqes, 0, 0); n != 0 || err != nil {
		t.Fatalf("answered before sq_head was published: %d %+v %v", n, cqes[:n], err)
	}
	close(release)
	unblocked = true
	cq := reapAll(t, q, 1)[2]
	if err := res.Check(cq); err != nil || cq.N != 1 || cq.State != xfer.StateCompleted {
		t.Fatalf("durable commit: %v %+v", err, cq)
	}
	if in, err := c.StoreStat(keys[0]); err != nil || !in.InL2 {
		t.Fatalf("the durable commit is not on L2: %+v %v", in, err)
	}
}

// gateRemote is other hosts whose homes answer Present only once gate is
// closed; asked gets a token when the first Present starts. far are the
// keys they hold. Nothing is fetched, announced or removed.
type gateRemote struct {
	asked chan struct{}
	gate  chan struct{}
	far   map[string]bool
}

func (r *gateRemote) Stored([]byte, uint64, uint32, bool, store.RecordID) {}
func (r *gateRemote) Evicted([]byte)                                      {}
func (r *gateRemote) Removed([][]byte, []error)                           {}
func (r *gateRemote) SizeOf([]byte) (uint64, bool)                        { return 0, false }

func (r *gateRemote) Fetch(keys [][]byte, done func(int, error)) {
	for i := range keys {
		done(i, store.ErrNotFound)
	}
}

func (r *gateRemote) Present(keys [][]byte, found []bool) {
	select {
	case r.asked <- struct{}{}:
	default:
	}
	<-r.gate
	for i, k := range keys {
		found[i] = found[i] || r.far[string(k)]
	}
}

// TestStoreQueueLookupPrefixElsewhere: a LookupPrefix through the queue
// whose run goes on past the keys stored here answers the run here at
// once and asks the other hosts' homes in the background: while they have
// not answered, the worker goes on serving (a no-op submitted behind it is
// answered), and the lookup's CQE then counts the run across hosts.
func TestStoreQueueLookupPrefixElsewhere(t *testing.T) {
	e := newStoreEnv(t, false, store.Config{})
	r := &gateRemote{asked: make(chan struct{}, 1), gate: make(chan struct{}), far: map[string]bool{"far/1": true}}
	e.s.SetRemote(r)
	opened := false
	defer func() {
		if !opened {
			close(r.gate)
		}
	}()
	c, q := queueClient(t, e.env, 32)
	if err := c.PutBytes([]byte("here/0"), []byte("value here"), false); err != nil {
		t.Fatal(err)
	}
	chain := [][]byte{[]byte("here/0"), []byte("far/1"), []byte("absent"), []byte("here/0")}
	if ok, err := q.LookupPrefix(chain, false, 1); !ok || err != nil {
		t.Fatalf("submit the lookup: %v %v", ok, err)
	}
	select {
	case <-r.asked:
	case <-time.After(testTimeout):
		t.Fatalf("the homes were not asked within %v", testTimeout)
	}
	if ok, err := q.Nop(2); !ok || err != nil {
		t.Fatalf("submit the no-op: %v %v", ok, err)
	}
	cqes := make([]client.Completion, 4)
	n, err := q.Reap(cqes, 1, testTimeout)
	if err != nil || n != 1 || cqes[0].UserData != 2 {
		t.Fatalf("with the homes not answering, reaped %d %+v %v: want the no-op's answer alone", n, cqes[:n], err)
	}
	close(r.gate)
	opened = true
	cq := reapAll(t, q, 1)[1]
	if cq.Code != tcproto.CodeOK || cq.State != xfer.StateCompleted || cq.N != 2 {
		t.Fatalf("lookup prefix across hosts: %+v, want a run of 2", cq)
	}
}

// TestStoreQueueRefusalAfterPublish: a refused store SQE is answered, as
// every answer of the worker's, only once the worker has published sq_head
// past its entry.
func TestStoreQueueRefusalAfterPublish(t *testing.T) {
	e := newStoreEnv(t, false, store.Config{MaxKeysPerCall: 8})
	rq := openRawStoreQueue(t, e.env)
	inPrepare, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	armed.Store(true)
	beforePublish := func() {
		if armed.CompareAndSwap(true, false) {
			close(inPrepare)
			<-release
		}
	}
	testhook.QueuePublish.Store(&beforePublish)
	t.Cleanup(func() { testhook.QueuePublish.Store(nil) })
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	keys := wire.AppendKeys(nil, [][]byte{[]byte("a"), []byte("bb")})
	sqe := queue.SQE{Op: queue.OpStoreExists, Count: 2, Local: 999, LocalOff: 64, UserData: 7} // results in no segment
	d, ok, err := rq.ring.StageData(&sqe, len(keys))
	if !ok || err != nil {
		t.Fatalf("stage: %v %v", ok, err)
	}
	copy(d, keys)
	rq.ring.Submit()
	select {
	case <-inPrepare:
	case <-time.After(testTimeout):
		t.Fatalf("the worker did not take the entry within %v", testTimeout)
	}
	var cq [1]queue.CQE
	if n := rq.ring.Reap(cq[:]); n != 0 {
		t.Fatalf("refusal %+v answered before sq_head was published", cq[0])
	}
	close(release)
	released = true
	if err := rq.ring.Wait(1, testTimeout); err != nil {
		t.Fatal(err)
	}
	if n := rq.ring.Reap(cq[:]); n != 1 || cq[0].UserData != 7 || cq[0].Code != uint32(tcproto.CodeNOT_FOUND) {
		t.Fatalf("refusal: %d %+v, want NOT_FOUND for 7", n, cq[0])
	}
}
