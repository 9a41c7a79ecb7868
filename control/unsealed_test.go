package control

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/faultcopy"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// hostPool is a client's own memory the way an engine's shared-memory
// host allocator makes it: a memfd created without MFD_ALLOW_SEALING
// (which can never be sealed), sized, and mapped by the client.
type hostPool struct {
	fd   int
	size uint64
	mem  []byte // the client's mapping: not to be touched once shrunk
}

func newHostPool(t *testing.T, size uint64, sealable bool) *hostPool {
	t.Helper()
	var fd int
	if sealable {
		var err error
		if fd, err = shm.NewMemfd("engine-host-pool", size, false); err != nil {
			t.Fatal(err)
		}
	} else {
		fd = testutil.UnsealableMemfd(t, int64(size))
	}
	t.Cleanup(func() { unix.Close(fd) })
	mem, err := shm.MapShared(fd, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Unmap(mem) })
	for i := range mem {
		mem[i] = byte(i*7 + i>>12)
	}
	return &hostPool{fd: fd, size: size, mem: mem}
}

// engineWithHostPool is a store env whose client (with a queue) has
// registered an unsealable host pool of size bytes as seg.
func engineWithHostPool(t *testing.T, size uint64) (*storeEnv, *hostPool, *client.Client, *client.Queue, xfer.SegmentID) {
	t.Helper()
	e := newStoreEnv(t, false, store.Config{})
	hp := newHostPool(t, size, false)
	eng, q := queueClient(t, e.env, 16)
	seg, err := eng.RegisterFD(hp.fd, size)
	if err != nil {
		t.Fatalf("registering an unsealable memfd: %v", err)
	}
	return e, hp, eng, q, seg
}

// codeOf is the status code a client sees for err (OK for nil).
func codeOf(err error) wire.Code {
	var se *client.StatusError
	switch {
	case err == nil:
		return tcproto.CodeOK
	case errors.As(err, &se):
		return se.Code
	case errors.Is(err, client.ErrFailedPrecondition):
		return tcproto.CodeFAILED_PRECONDITION
	}
	return tcproto.CodeINTERNAL
}

// TestSealedBufferRegisteredQuietly: a buffer the client library sealed,
// the usual case, is registered with a debug line only (a client may
// register as often as it likes); an unsealed one is an info line
// (TestUnsealedHostPoolTruncated).
func TestSealedBufferRegisteredQuietly(t *testing.T) {
	e := newEnv(t, false)
	c, err := client.Dial(e.sock, client.Options{Name: "sealed"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		if _, err := c.RegisterBuffer(1 << 16); err != nil {
			t.Fatal(err)
		}
	}
	log := e.logBuf.String()
	if n := strings.Count(log, `level=DEBUG msg="buffer registered"`); n != 3 || !strings.Contains(log, `sealing="sealed by client"`) {
		t.Fatalf("%d debug lines of sealed registrations, want 3:\n%s", n, log)
	}
	if strings.Contains(log, `level=INFO msg="buffer registered"`) {
		t.Fatalf("a sealed buffer's registration logged at info:\n%s", log)
	}
}

// TestUnsealedHostPoolTruncated: an engine registers its host pool, an
// unsealable memfd, and every path the daemon has for a client buffer moves
// its bytes exactly. Then the engine truncates it to zero: each of those
// paths fails its own request with FAILED_PRECONDITION (a batch transfer,
// the store's copying put and get, a queue transfer, a queue store call
// whose results go there), the faults are counted, and another client, and
// the engine itself with memory it did not shrink, go on byte-exact. TCP and
// exports refuse the unsealed buffer from the start.
func TestUnsealedHostPoolTruncated(t *testing.T) {
	const size = 1 << 20
	const blk = 64 << 10
	e, hp, eng, q, seg := engineWithHostPool(t, size)
	if log := e.logBuf.String(); !strings.Contains(log, `level=INFO msg="buffer registered"`) || !strings.Contains(log, "sealing=unsealed") {
		t.Fatalf("no log line says the buffer is unsealed:\n%s", log)
	}
	// The engine cannot shrink-proof it: no seal can be added.
	if _, err := unix.FcntlInt(uintptr(hp.fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); !errors.Is(err, unix.EPERM) {
		t.Fatalf("F_ADD_SEALS on a memfd without MFD_ALLOW_SEALING: %v", err)
	}
	// Refused where a fault could not be kept to one request.
	if _, err := eng.ExportSegment("host-pool", seg, 0, 0, 3); codeOf(err) != tcproto.CodeFAILED_PRECONDITION {
		t.Fatalf("export of an unsealed buffer: %v, want FAILED_PRECONDITION", err)
	}

	offs, err := eng.AllocBlocks(nil, 2, blk)
	if err != nil {
		t.Fatal(err)
	}
	pool := eng.PoolBytes()
	res := make([]error, 1)
	// Every path works while the memfd is whole.
	if _, err := eng.Transfer([]xfer.Request{{Op: xfer.OpWrite, Local: seg, LocalOffset: blk, Target: testPoolID,
		TargetOffset: offs[0], Length: blk}}, testTimeout, res); err != nil || res[0] != nil {
		t.Fatalf("batch write from the host pool: %v %v", err, res[0])
	}
	if !bytes.Equal(pool[offs[0]:offs[0]+blk], hp.mem[blk:2*blk]) {
		t.Fatal("batch write moved other bytes")
	}
	if err := eng.StorePut([][]byte{[]byte("page-0")}, []client.Extent{{Segment: seg, Offset: 2 * blk, Length: blk}}, false, res); err != nil || res[0] != nil {
		t.Fatalf("store put from the host pool: %v %v", err, res[0])
	}
	lens := make([]uint64, 1)
	if err := eng.StoreRead([][]byte{[]byte("page-0")}, []client.Extent{{Segment: seg, Offset: 3 * blk, Length: blk}}, lens, res); err != nil || res[0] != nil || lens[0] != blk {
		t.Fatalf("store get into the host pool: %v %v %d", err, res[0], lens[0])
	}
	if !bytes.Equal(hp.mem[3*blk:4*blk], hp.mem[2*blk:3*blk]) {
		t.Fatal("store get wrote other bytes")
	}
	if n, err := q.Submit([]xfer.Request{{Op: xfer.OpRead, Local: seg, LocalOffset: 4 * blk, Target: testPoolID,
		TargetOffset: offs[0], Length: blk}}, []uint64{1}); n != 1 || err != nil {
		t.Fatalf("queue submit: %d %v", n, err)
	}
	if cq := reapAll(t, q, 1)[1]; cq.Err() != nil || cq.N != blk {
		t.Fatalf("queue read into the host pool: %+v", cq)
	}
	if !bytes.Equal(hp.mem[4*blk:5*blk], pool[offs[0]:offs[0]+blk]) {
		t.Fatal("queue read wrote other bytes")
	}
	// Results of a queue store call land in the host pool; the client's
	// own view of them is a copy (the engine's mapping must not be touched
	// after the truncation below).
	results, err := eng.ResultsIn(&client.Buffer{ID: seg, Mem: make([]byte, size)}, 5*blk, 4)
	if err != nil {
		t.Fatal(err)
	}
	if cq, _ := qcall(t, q, nil, 2, func() (bool, error) { return q.Exists([][]byte{[]byte("page-0")}, results, 2) }); cq.Code != tcproto.CodeOK || cq.N != 1 {
		t.Fatalf("queue exists with results in the host pool: %+v", cq)
	}
	if code, _, _, ok := queue.StoreResult(hp.mem[5*blk:]); !ok || code != uint8(tcproto.CodeOK) {
		t.Fatalf("the record in the host pool: code %d ok %v", code, ok)
	}

	// The engine shrinks its host pool to nothing.
	if err := unix.Ftruncate(hp.fd, 0); err != nil {
		t.Fatal(err)
	}
	faults := faultcopy.Faults()
	want := func(what string, err error) {
		t.Helper()
		if c := codeOf(err); c != tcproto.CodeFAILED_PRECONDITION {
			t.Errorf("%s after the truncation: %v (%s), want FAILED_PRECONDITION", what, err, c)
		}
	}
	if _, err := eng.Transfer([]xfer.Request{{Op: xfer.OpWrite, Local: seg, LocalOffset: blk, Target: testPoolID,
		TargetOffset: offs[1], Length: blk}}, testTimeout, res); err != nil && !errors.Is(err, client.ErrFailedPrecondition) {
		t.Fatalf("batch write: %v", err)
	}
	want("batch write from the host pool", res[0])
	if _, err := eng.Transfer([]xfer.Request{{Op: xfer.OpRead, Local: seg, LocalOffset: 0, Target: testPoolID,
		TargetOffset: offs[1], Length: blk}}, testTimeout, res); err != nil && !errors.Is(err, client.ErrFailedPrecondition) {
		t.Fatalf("batch read: %v", err)
	}
	want("batch read into the host pool", res[0])
	if err := eng.StorePut([][]byte{[]byte("page-1")}, []client.Extent{{Segment: seg, Offset: 2 * blk, Length: blk}}, false, res); err != nil {
		t.Fatalf("store put: %v", err)
	}
	want("store put from the host pool", res[0])
	if err := eng.StoreRead([][]byte{[]byte("page-0")}, []client.Extent{{Segment: seg, Offset: 3 * blk, Length: blk}}, lens, res); err != nil {
		t.Fatalf("store get: %v", err)
	}
	want("store get into the host pool", res[0])
	if n, err := q.Submit([]xfer.Request{{Op: xfer.OpRead, Local: seg, LocalOffset: 4 * blk, Target: testPoolID,
		TargetOffset: offs[0], Length: blk}}, []uint64{3}); n != 1 || err != nil {
		t.Fatalf("queue submit: %d %v", n, err)
	}
	want("queue read into the host pool", reapAll(t, q, 1)[3].Err())
	cq, _ := qcall(t, q, nil, 4, func() (bool, error) { return q.Exists([][]byte{[]byte("page-0")}, results, 4) })
	if cq.Code != tcproto.CodeFAILED_PRECONDITION || cq.State != xfer.StateFailed {
		t.Errorf("queue store call with its results in the shrunk host pool: %+v, want FAILED_PRECONDITION", cq)
	}
	if got := faultcopy.Faults() - faults; got < 6 {
		t.Errorf("%d faults counted, want at least 6", got)
	}
	// The failed put left nothing behind: the key is free.
	if _, err := eng.StoreStat([]byte("page-1")); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("a put that faulted left its key: %v", err)
	}

	// Everyone goes on: another client, byte-exact, and the engine with a
	// buffer it did not shrink, and with its host pool once regrown.
	other, err := client.Dial(e.sock, client.Options{Name: "bystander"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := bystander(other, "after"); err != nil {
		t.Fatal(err)
	}
	if err := eng.PutBytes([]byte("engine-after"), []byte("still here"), false); err != nil {
		t.Fatalf("the engine's own put with a buffer it did not shrink: %v", err)
	}
	if err := unix.Ftruncate(hp.fd, size); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Transfer([]xfer.Request{{Op: xfer.OpWrite, Local: seg, LocalOffset: blk, Target: testPoolID,
		TargetOffset: offs[1], Length: blk}}, testTimeout, res); err != nil || res[0] != nil {
		t.Fatalf("batch write from the regrown host pool: %v %v", err, res[0])
	}
	if !bytes.Equal(pool[offs[1]:offs[1]+blk], make([]byte, blk)) {
		t.Fatal("the regrown host pool's zero pages did not arrive")
	}
	if err := eng.UnregisterBuffer(seg); err != nil {
		t.Fatal(err)
	}
}

// bystander puts and gets a value through a buffer of c's own and checks
// its bytes.
func bystander(c *client.Client, tag string) error {
	key := []byte("bystander-" + tag)
	val := bytes.Repeat([]byte(tag), 8<<10)
	if err := c.PutBytes(key, val, false); err != nil {
		return fmt.Errorf("bystander put: %w", err)
	}
	got, err := c.GetBytes(key)
	if err != nil || !bytes.Equal(got, val) {
		return fmt.Errorf("bystander get: %v, %d bytes, equal %v", err, len(got), bytes.Equal(got, val))
	}
	res := make([]error, 1)
	if err := c.StoreRemove([][]byte{key}, res); err != nil || res[0] != nil {
		return fmt.Errorf("bystander remove: %v %v", err, res[0])
	}
	return nil
}

// TestUnsealedHostPoolShrinkingUnderLoad: the engine shrinks and regrows
// its host pool over and over while it moves pages between it and the pool
// through the queue and the store: every request ends OK or
// FAILED_PRECONDITION, and a bystander's puts and gets stay byte-exact
// throughout.
func TestUnsealedHostPoolShrinkingUnderLoad(t *testing.T) {
	const size = 1 << 20
	const blk = 64 << 10
	e, hp, eng, q, seg := engineWithHostPool(t, size)
	offs, err := eng.AllocBlocks(nil, 1, blk)
	if err != nil {
		t.Fatal(err)
	}
	other, err := client.Dial(e.sock, client.Options{Name: "bystander"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	var stop atomic.Bool
	var wg sync.WaitGroup
	var shrinks atomic.Int64
	wg.Add(2)
	go func() { // the engine's own thread that keeps resizing it
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			sz := int64(size)
			if i%2 == 0 {
				sz = int64(i%16) * 4096
			}
			if err := unix.Ftruncate(hp.fd, sz); err != nil {
				t.Errorf("ftruncate: %v", err)
				return
			}
			shrinks.Add(1)
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			if err := bystander(other, fmt.Sprint(i%7)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var ok, failed int
	res := make([]error, 1)
	deadline := time.Now().Add(testTimeout)
	for i := 0; (failed == 0 || ok == 0 || i < 200) && time.Now().Before(deadline); i++ {
		var codes []wire.Code
		off := uint64(i%15) * blk
		ud := uint64(i)
		if n, err := q.Submit([]xfer.Request{{Op: xfer.Op(1 + i%2), Local: seg, LocalOffset: off, Target: testPoolID,
			TargetOffset: offs[0], Length: blk}}, []uint64{ud}); n != 1 || err != nil {
			t.Fatalf("queue submit: %d %v", n, err)
		}
		codes = append(codes, reapAll(t, q, 1)[ud].Code)
		key := []byte(fmt.Sprintf("load-%d", i))
		if err := eng.StorePut([][]byte{key}, []client.Extent{{Segment: seg, Offset: off, Length: blk}}, false, res); err != nil {
			t.Fatalf("store put: %v", err)
		}
		codes = append(codes, codeOf(res[0]))
		if res[0] == nil {
			if err := eng.StoreRead([][]byte{key}, []client.Extent{{Segment: seg, Offset: off + blk, Length: blk}}, make([]uint64, 1), res); err != nil {
				t.Fatalf("store get: %v", err)
			}
			codes = append(codes, codeOf(res[0]))
			eng.StoreRemove([][]byte{key}, res)
		}
		for _, c := range codes {
			switch c {
			case tcproto.CodeOK:
				ok++
			case tcproto.CodeFAILED_PRECONDITION:
				failed++
			default:
				t.Fatalf("request %d: %s, want OK or FAILED_PRECONDITION", i, c)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d requests OK, %d failed on a fault, %d resizes", ok, failed, shrinks.Load())
	if failed == 0 || ok == 0 {
		t.Fatalf("%d OK and %d faulted: the load did not meet the resizes", ok, failed)
	}
	if err := bystander(other, "end"); err != nil {
		t.Fatal(err)
	}
}

// TestSealableHostPoolSealedByDaemon: a memfd that allows sealing is
// sealed against shrinking as it registers, so the engine's own shrink
// fails in the engine and transfers go on.
func TestSealableHostPoolSealedByDaemon(t *testing.T) {
	e := newEnv(t, false)
	const size = 256 << 10
	hp := newHostPool(t, size, true)
	c, err := client.Dial(e.sock, client.Options{Name: "sealable"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seg, err := c.RegisterFD(hp.fd, size)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.logBuf.String(), `sealing="sealed by daemon"`) {
		t.Fatalf("no log line says the daemon sealed it:\n%s", e.logBuf.String())
	}
	if err := unix.Ftruncate(hp.fd, 0); !errors.Is(err, unix.EPERM) {
		t.Fatalf("the engine's shrink of its sealed host pool: %v, want EPERM", err)
	}
	offs, err := c.AllocBlocks(nil, 1, size)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]error, 1)
	if _, err := c.Transfer([]xfer.Request{{Op: xfer.OpWrite, Local: seg, Target: testPoolID, TargetOffset: offs[0], Length: size}},
		testTimeout, res); err != nil || res[0] != nil {
		t.Fatalf("write: %v %v", err, res[0])
	}
	if !bytes.Equal(c.PoolBytes()[offs[0]:offs[0]+size], hp.mem) {
		t.Fatal("the pool block differs from the host pool")
	}
	// A sealed buffer may be exported (the refusal is for unsealed ones
	// only): what answers here is the missing peer plane, not the seal.
	if _, err := c.ExportSegment("sealed", seg, 0, 0, 3); codeOf(err) == tcproto.CodeFAILED_PRECONDITION {
		t.Fatalf("export of a sealed buffer refused as unsealed: %v", err)
	}
}

// TestUnsealedHostPoolTruncatedInsideACall: a copying put and get of many
// pages (an engine's batch) move every byte exactly; once the engine
// truncates its host pool inside a call's span, each key past the cut fails
// alone with FAILED_PRECONDITION and the keys before it move exactly.
func TestUnsealedHostPoolTruncatedInsideACall(t *testing.T) {
	const blk, n, cut = 256 << 10, 40, 27 // 10 MiB a call
	_, hp, eng, _, seg := engineWithHostPool(t, 2*n*blk)
	keys, src, dst := make([][]byte, n), make([]client.Extent, n), make([]client.Extent, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "split-%02d", i)
		src[i] = client.Extent{Segment: seg, Offset: uint64(i) * blk, Length: blk}
		dst[i] = client.Extent{Segment: seg, Offset: uint64(n+i) * blk, Length: blk}
	}
	res, lens := make([]error, n), make([]uint64, n)
	check := func(what string, ok int) {
		t.Helper()
		for i, err := range res {
			c := codeOf(err)
			switch {
			case i >= ok && c != tcproto.CodeFAILED_PRECONDITION:
				t.Errorf("%s: key %d past the cut: %v (%s), want FAILED_PRECONDITION", what, i, err, c)
			case i < ok && c != tcproto.CodeOK:
				t.Errorf("%s: key %d: %v", what, i, err)
			}
		}
	}
	if err := eng.StorePut(keys, src, false, res); err != nil {
		t.Fatal(err)
	}
	check("put", n)
	clear(hp.mem[n*blk:])
	if err := eng.StoreRead(keys, dst, lens, res); err != nil {
		t.Fatal(err)
	}
	check("get", n)
	if !bytes.Equal(hp.mem[n*blk:], hp.mem[:n*blk]) {
		t.Fatal("the get moved other bytes")
	}

	// The gets' span cut after key cut-1.
	clear(hp.mem[n*blk:])
	if err := unix.Ftruncate(hp.fd, int64((n+cut)*blk)); err != nil {
		t.Fatal(err)
	}
	if err := eng.StoreRead(keys, dst, lens, res); err != nil {
		t.Fatal(err)
	}
	check("get into the truncated host pool", cut)
	if !bytes.Equal(hp.mem[n*blk:(n+cut)*blk], hp.mem[:cut*blk]) {
		t.Fatal("the gets before the cut moved other bytes")
	}

	// The puts' span cut after key cut-1: those past it are not stored.
	if err := unix.Ftruncate(hp.fd, int64(cut*blk)); err != nil {
		t.Fatal(err)
	}
	if err := eng.StoreRemove(keys, res); err != nil {
		t.Fatal(err)
	}
	check("remove", n)
	again := make([][]byte, n)
	for i := range again {
		again[i] = fmt.Appendf(nil, "split-again-%02d", i)
	}
	if err := eng.StorePut(again, src, false, res); err != nil {
		t.Fatal(err)
	}
	check("put from the truncated host pool", cut)
	for i := cut; i < n; i++ {
		if _, err := eng.StoreStat(again[i]); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("a put that faulted left key %d: %v", i, err)
		}
	}
	if err := eng.UnregisterBuffer(seg); err != nil {
		t.Fatal(err)
	}
}
