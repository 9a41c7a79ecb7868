//go:build linux

package uring

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// integrity writes random data at random aligned offsets and sizes from one
// region of the pool, reads it back into another, and compares checksums.
func integrity(t *testing.T, cfg Config, direct, register bool, rounds int) *Transport {
	t.Helper()
	dir := t.TempDir()
	cfg.AllowedDirs = []string{dir}
	tr := newTransport(t, cfg)
	const fileSize = 32 << 20
	f, err := tr.OpenFile(1, filepath.Join(dir, "data"), FileOptions{Direct: direct, Size: fileSize, Create: true})
	if err != nil {
		t.Fatalf("OpenFile: %v", err)
	}
	defer f.Close()
	pool := newMemSeg(t, 2, 16<<20)
	if register {
		if err := tr.RegisterBuffers(pool); err != nil {
			t.Fatalf("RegisterBuffers: %v", err)
		}
	}
	rng := rand.New(rand.NewPCG(1, uint64(len(t.Name()))))
	for i := range pool.Bytes()[:8<<20] {
		pool.Bytes()[i] = byte(rng.Uint32())
	}
	rec := newRecorder()
	const blk = 4096
	type io struct{ src, dst, off, length uint64 }
	var ios []io
	for i := 0; i < rounds; i++ {
		length := uint64(1+rng.IntN(64)) * blk
		if rng.IntN(8) == 0 {
			length = uint64(1+rng.IntN(4)) << 20 // some MiB-sized requests
		}
		ios = append(ios, io{
			src:    uint64(rng.IntN(int((8<<20-length)/blk))) * blk,
			dst:    8<<20 + uint64(rng.IntN(int((8<<20-length)/blk)))*blk,
			off:    uint64(rng.IntN(int((fileSize-length)/blk))) * blk,
			length: length,
		})
	}
	for _, x := range ios {
		w := newTask(rec, xfer.OpWrite, pool, x.src, f, x.off, x.length)
		if n, err := runOne(t, tr, rec, w); err != nil || n != x.length {
			t.Fatalf("write %+v: n=%d err=%v", x, n, err)
		}
		clear(pool.Bytes()[x.dst : x.dst+x.length])
		r := newTask(rec, xfer.OpRead, pool, x.dst, f, x.off, x.length)
		if n, err := runOne(t, tr, rec, r); err != nil || n != x.length {
			t.Fatalf("read %+v: n=%d err=%v", x, n, err)
		}
		want := crc32.Checksum(pool.Bytes()[x.src:x.src+x.length], castagnoli)
		got := crc32.Checksum(pool.Bytes()[x.dst:x.dst+x.length], castagnoli)
		if want != got {
			t.Fatalf("crc32c mismatch for %+v: wrote %08x read %08x", x, want, got)
		}
	}
	st := tr.Stats()[0]
	if register && tr.Features().FixedBuffers && st.Fixed == 0 {
		t.Fatalf("registered pool but no SQE used a fixed buffer: %+v", st)
	}
	if !register && st.Fixed != 0 {
		t.Fatalf("unregistered pool but %d SQEs used fixed buffers", st.Fixed)
	}
	return tr
}

func TestIntegrity(t *testing.T) {
	for _, tc := range []struct {
		name             string
		direct, register bool
	}{
		{"direct-fixed", true, true},
		{"direct-plain", true, false},
		{"buffered-fixed", false, true},
		{"buffered-plain", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) { integrity(t, Config{}, tc.direct, tc.register, 60) })
	}
}

// TestIntegrityModes runs the same check under each setup-flag combination
// the transport can choose, and with two rings.
func TestIntegrityModes(t *testing.T) {
	p := probe()
	for _, tc := range []struct {
		name string
		cfg  Config
		need bool
	}{
		{"single-issuer+defer", Config{SingleIssuer: On, DeferTaskrun: On}, p.deferTaskrun},
		{"coop-taskrun", Config{DeferTaskrun: Off, SingleIssuer: Off, CoopTaskrun: On}, p.coopTaskrun},
		{"plain", Config{DeferTaskrun: Off, SingleIssuer: Off, CoopTaskrun: Off}, true},
		{"two-rings", Config{Rings: 2}, true},
		{"no-fixed-files", Config{NoFixedFiles: true}, true},
		{"batch-1", Config{Batch: 1}, true},
		{"sqpoll", Config{SQPoll: true, SQPollIdle: 10 * time.Millisecond}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.need {
				testutil.Missing(t, testutil.IOUring, "the kernel lacks the setup flags for %s", tc.name)
			}
			tr := integrity(t, tc.cfg, true, true, 20)
			f := tr.Features()
			if tc.cfg.DeferTaskrun == On && !f.DeferTaskrun || tc.cfg.CoopTaskrun == On && !f.CoopTaskrun || tc.cfg.SQPoll != f.SQPoll {
				t.Fatalf("features %+v do not match config", f)
			}
		})
	}
}

func openTestFile(t *testing.T, tr *Transport, dir string, direct bool, size uint64) *File {
	t.Helper()
	f, err := tr.OpenFile(1, filepath.Join(dir, "f"), FileOptions{Direct: direct, Size: size, Create: true})
	if err != nil {
		t.Fatalf("OpenFile: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestShortIO truncates completions so the remainder path must finish them,
// with the default poller step and with one completion per step.
func TestShortIO(t *testing.T) {
	for _, batch := range []int{0, 1} {
		t.Run(fmt.Sprintf("batch-%d", batch), func(t *testing.T) { shortIO(t, batch) })
	}
}

func shortIO(t *testing.T, batch int) {
	dir := t.TempDir()
	var cut atomic.Int64
	hooks := &testHooks{result: func(op uint8, res int32) int32 {
		if res > 4096 {
			cut.Add(1)
			return res / 2 &^ 4095 // keep O_DIRECT alignment for the rest
		}
		return res
	}}
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, Batch: batch, hooks: hooks})
	f := openTestFile(t, tr, dir, true, 8<<20)
	pool := newMemSeg(t, 2, 4<<20)
	for i := range pool.Bytes()[:1<<20] {
		pool.Bytes()[i] = byte(i * 7)
	}
	rec := newRecorder()
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpWrite, pool, 0, f, 1<<20, 1<<20)); err != nil || n != 1<<20 {
		t.Fatalf("write: %d %v", n, err)
	}
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, pool, 2<<20, f, 1<<20, 1<<20)); err != nil || n != 1<<20 {
		t.Fatalf("read: %d %v", n, err)
	}
	if crc32.Checksum(pool.Bytes()[:1<<20], castagnoli) != crc32.Checksum(pool.Bytes()[2<<20:3<<20], castagnoli) {
		t.Fatal("data differs after short transfers")
	}
	if cut.Load() == 0 || tr.Stats()[0].Resubmits == 0 {
		t.Fatalf("remainder path not exercised: cut=%d stats=%+v", cut.Load(), tr.Stats()[0])
	}
}

// TestFaultInjection: EIO ends the task with an error naming the errno;
// EAGAIN, and an ECANCELED nobody asked for, are retried until they
// succeed; an ECANCELED that never stops ends the task, bounded.
func TestFaultInjection(t *testing.T) {
	dir := t.TempDir()
	var mode atomic.Int32 // 0 pass, 1 EIO, 2 EAGAIN twice, 3 ECANCELED twice, 4 ECANCELED always
	var eagain atomic.Int32
	hooks := &testHooks{result: func(op uint8, res int32) int32 {
		switch mode.Load() {
		case 1:
			return -int32(syscall.EIO)
		case 2:
			if eagain.Add(1) <= 2 {
				return -int32(syscall.EAGAIN)
			}
		case 3:
			if eagain.Add(1) <= 2 {
				return -int32(syscall.ECANCELED)
			}
		case 4:
			eagain.Add(1)
			return -int32(syscall.ECANCELED)
		}
		return res
	}}
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, hooks: hooks})
	f := openTestFile(t, tr, dir, true, 1<<20)
	pool := newMemSeg(t, 2, 1<<20)
	rec := newRecorder()

	mode.Store(1)
	_, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, pool, 0, f, 0, 4096))
	if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("EIO injection: got %v", err)
	}
	mode.Store(2)
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpWrite, pool, 0, f, 0, 4096)); err != nil || n != 4096 {
		t.Fatalf("EAGAIN retry: n=%d err=%v", n, err)
	}
	if eagain.Load() < 3 {
		t.Fatalf("EAGAIN hook ran %d times, want >= 3", eagain.Load())
	}
	// The kernel cancels what nobody canceled when io-wq cannot start a
	// worker for it: the write goes again, and lands.
	eagain.Store(0)
	mode.Store(3)
	for i := range pool.Bytes()[:4096] {
		pool.Bytes()[i] = byte(i * 3)
	}
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpWrite, pool, 0, f, 4096, 4096)); err != nil || n != 4096 {
		t.Fatalf("unasked ECANCELED retry: n=%d err=%v", n, err)
	}
	if eagain.Load() != 3 || tr.Stats()[0].KernelCancels != 2 {
		t.Fatalf("ECANCELED hook ran %d times, kernel cancels %d: want 3 and 2", eagain.Load(), tr.Stats()[0].KernelCancels)
	}
	mode.Store(0)
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, pool, 1<<19, f, 4096, 4096)); err != nil || n != 4096 ||
		!bytes.Equal(pool.Bytes()[:4096], pool.Bytes()[1<<19:1<<19+4096]) {
		t.Fatalf("read back after the retried write: n=%d err=%v", n, err)
	}
	// One the kernel cancels every time ends, as an I/O error naming it.
	eagain.Store(0)
	mode.Store(4)
	if _, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, pool, 0, f, 0, 4096)); !errors.Is(err, syscall.ECANCELED) ||
		errors.Is(err, xfer.ErrCanceled) || eagain.Load() != maxRetries+1 {
		t.Fatalf("ECANCELED always: err=%v after %d answers, want the errno after %d", err, eagain.Load(), maxRetries+1)
	}
	mode.Store(0)
	// Reading past what the file holds is an unexpected EOF, not success.
	f2, err := tr.OpenFile(3, filepath.Join(dir, "short"), FileOptions{Create: true, Size: 8192})
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	if err := os.Truncate(filepath.Join(dir, "short"), 4096); err != nil {
		t.Fatal(err)
	}
	n, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, pool, 0, f2, 0, 8192))
	if !errors.Is(err, ErrShortIO) || n != 4096 {
		t.Fatalf("read past EOF: n=%d err=%v", n, err)
	}
}

// TestBackpressure submits 1000 tasks to a ring of 8 slots in one call.
func TestBackpressure(t *testing.T) {
	dir := t.TempDir()
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, Entries: 8})
	f := openTestFile(t, tr, dir, true, 4<<20)
	pool := newMemSeg(t, 2, 4<<20)
	rec := newRecorder()
	tasks := make([]*xfer.Task, 1000)
	for i := range tasks {
		off := uint64(i%1024) * 4096
		tasks[i] = newTask(rec, xfer.OpRead, pool, off, f, off, 4096)
	}
	n, err := tr.Submit(tasks)
	if n != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v; stats %+v", n, err, tr.Stats())
	}
	waitEnded(t, rec, int64(len(tasks)), 30*time.Second)
	for i, task := range tasks {
		if calls, moved, err := result(rec, task); calls != 1 || moved != 4096 || err != nil {
			t.Fatalf("task %d: calls=%d n=%d err=%v", i, calls, moved, err)
		}
	}
	if st := tr.Stats()[0]; st.Entries != 8 || st.InFlight != 0 || st.Completed != 1000 {
		t.Fatalf("stats %+v", st)
	}
}

// TestBatchBoundsEnter: one Submit of 32 tasks reaches the kernel in steps
// of at most Config.Batch SQEs per io_uring_enter, and every task still
// ends once with its bytes.
func TestBatchBoundsEnter(t *testing.T) {
	dir := t.TempDir()
	const tasks, batch = 32, 2
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, Entries: 64, Batch: batch})
	f := openTestFile(t, tr, dir, true, 4<<20)
	pool := newMemSeg(t, 2, tasks*4096)
	rec := newRecorder()
	ts := make([]*xfer.Task, tasks)
	for i := range ts {
		ts[i] = newTask(rec, xfer.OpRead, pool, uint64(i)*4096, f, uint64(i)*8192, 4096)
	}
	before := tr.Stats()[0].Enters
	if n, err := tr.Submit(ts); n != tasks || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	waitEnded(t, rec, tasks, 10*time.Second)
	for i, task := range ts {
		if calls, moved, err := result(rec, task); calls != 1 || moved != 4096 || err != nil {
			t.Fatalf("task %d: calls=%d n=%d err=%v", i, calls, moved, err)
		}
	}
	st := tr.Stats()[0]
	if st.Submitted != tasks {
		t.Fatalf("submitted %d SQEs, want %d", st.Submitted, tasks)
	}
	if enters := st.Enters - before; enters < tasks/batch {
		t.Fatalf("%d SQEs went to the kernel in %d io_uring_enter calls: more than Batch=%d per call", tasks, enters, batch)
	}
}

// TestQueueFullBound: a ring that cannot make room returns ErrQueueFull
// after SubmitWait, with n as the boundary.
func TestQueueFullBound(t *testing.T) {
	dir := t.TempDir()
	block := make(chan struct{})
	rec := newRecorder()
	hold := xfertest.Func(func(t *xfer.Task, n uint64, err error) { rec.TaskDone(t, n, err); <-block }) // holds the poller
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, Entries: 2, SubmitWait: 100 * time.Millisecond})
	f := openTestFile(t, tr, dir, true, 1<<20)
	pool := newMemSeg(t, 2, 1<<20)
	tasks := make([]*xfer.Task, 10)
	for i := range tasks {
		tasks[i] = newTask(hold, xfer.OpRead, pool, 0, f, 0, 4096)
	}
	n, err := tr.Submit(tasks)
	if !errors.Is(err, ErrQueueFull) || n < 2 || n >= len(tasks) {
		t.Fatalf("Submit = %d, %v; want 2..9 and ErrQueueFull", n, err)
	}
	close(block)
	waitEnded(t, rec, int64(n), 10*time.Second)
	for i, task := range tasks {
		calls, _, _ := result(rec, task)
		if i < n && calls != 1 || i >= n && calls != 0 {
			t.Fatalf("task %d (n=%d) ended %d times", i, n, calls)
		}
	}
}

// TestCloseInFlight closes with hundreds of requests in flight: Close
// returns, every dispatched task ends exactly once, Submit is refused.
func TestCloseInFlight(t *testing.T) {
	dir := t.TempDir()
	tr, err := New(Config{AllowedDirs: []string{dir}, Entries: 512, DrainTimeout: 5 * time.Second}, nil)
	testutil.RequireSupported(t, testutil.IOUring, err)
	f, err := tr.OpenFile(1, filepath.Join(dir, "f"), FileOptions{Direct: true, Size: 64 << 20, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	pool := newMemSeg(t, 2, 64<<20)
	if err := tr.RegisterBuffers(pool); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	tasks := make([]*xfer.Task, 2000)
	for i := range tasks {
		off := uint64(i%512) * (128 << 10)
		op := xfer.OpRead
		if i%2 == 1 {
			op = xfer.OpWrite
		}
		tasks[i] = newTask(rec, op, pool, off, f, off, 128<<10)
	}
	dispatched := make(chan int, 1)
	go func() {
		n, _ := tr.Submit(tasks)
		dispatched <- n
	}()
	// Let some hundreds reach the kernel, then close.
	testutil.Eventually(t, 5*time.Second, func() bool { return tr.Stats()[0].Submitted >= 300 },
		"300 requests submitted to the kernel (submitted: %v)", testutil.Lazy(func() uint64 { return tr.Stats()[0].Submitted }))
	start := time.Now()
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Fatalf("Close took %v", d)
	}
	n := <-dispatched
	if int(int64(rec.Count())) != n {
		t.Fatalf("dispatched %d, ended %d", n, int64(rec.Count()))
	}
	closed := 0
	for i, task := range tasks {
		calls, _, err := result(rec, task)
		if i < n && calls != 1 || i >= n && calls != 0 {
			t.Fatalf("task %d (n=%d) ended %d times", i, n, calls)
		}
		if errors.Is(err, xfer.ErrClosed) {
			closed++
		} else if err != nil {
			t.Fatalf("task %d: unexpected error %v", i, err)
		}
	}
	t.Logf("dispatched %d of %d before Close; %d ended with ErrClosed", n, len(tasks), closed)
	if m, err := tr.Submit(tasks[:1]); m != 0 || !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("Submit after Close = %d, %v", m, err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if f.Acquire() {
		t.Fatal("file still acquirable after transport Close")
	}
}

func TestCancel(t *testing.T) {
	dir := t.TempDir()
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, Entries: 64})
	f := openTestFile(t, tr, dir, true, 64<<20)
	pool := newMemSeg(t, 2, 64<<20)
	rec := newRecorder()
	// Hold the poller inside the first Done so the next tasks stay queued.
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	hold := xfertest.Func(func(t *xfer.Task, n uint64, err error) {
		rec.TaskDone(t, n, err)
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
	})
	if n, err := tr.Submit([]*xfer.Task{newTask(hold, xfer.OpRead, pool, 0, f, 0, 4096)}); n != 1 {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	<-entered
	queued := make([]*xfer.Task, 16)
	for i := range queued {
		queued[i] = newTask(hold, xfer.OpWrite, pool, uint64(i)<<20, f, uint64(i)<<20, 1<<20)
	}
	if n, err := tr.Submit(queued); n != len(queued) || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	for _, task := range queued {
		tr.Cancel(task)
	}
	close(release)
	waitEnded(t, rec, int64(1+len(queued)), 10*time.Second)
	for i, task := range queued {
		if calls, moved, err := result(rec, task); calls != 1 || moved != 0 || !errors.Is(err, xfer.ErrCanceled) {
			t.Fatalf("queued task %d: calls=%d n=%d err=%v", i, calls, moved, err)
		}
	}

	// Tasks already in the kernel: ASYNC_CANCEL races the device; each
	// still ends exactly once, canceled or with its full result.
	inflight := make([]*xfer.Task, 48)
	for i := range inflight {
		inflight[i] = newTask(hold, xfer.OpWrite, pool, uint64(i)<<20, f, uint64(i)<<20, 1<<20)
	}
	before := int64(rec.Count())
	if n, err := tr.Submit(inflight); n != len(inflight) || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	for _, task := range inflight {
		tr.Cancel(task)
	}
	tr.Cancel(&xfer.Task{Tag: 1<<40 | 7}) // unknown: ignored
	tr.Cancel(nil)
	waitEnded(t, rec, before+int64(len(inflight)), 10*time.Second)
	canceled := 0
	for i, task := range inflight {
		calls, moved, err := result(rec, task)
		switch {
		case calls != 1:
			t.Fatalf("task %d ended %d times", i, calls)
		case err == nil && moved != 1<<20:
			t.Fatalf("task %d: success with n=%d", i, moved)
		case errors.Is(err, xfer.ErrCanceled):
			canceled++
		case err != nil:
			t.Fatalf("task %d: %v", i, err)
		}
	}
	t.Logf("%d of %d in-flight tasks canceled before the device finished them", canceled, len(inflight))
}

func TestBadRequests(t *testing.T) {
	dir := t.TempDir()
	tr := newTransport(t, Config{AllowedDirs: []string{dir}})
	f := openTestFile(t, tr, dir, false, 1<<20)
	pool := newMemSeg(t, 2, 1<<20)
	other := newTransport(t, Config{AllowedDirs: []string{dir}})
	fOther, err := other.OpenFile(9, filepath.Join(dir, "o"), FileOptions{Create: true, Size: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer fOther.Close()
	ro, err := tr.OpenFile(4, filepath.Join(dir, "f"), FileOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	rec := newRecorder()
	for _, tc := range []struct {
		name string
		task *xfer.Task
		want error
	}{
		{"zero length", newTask(rec, xfer.OpRead, pool, 0, f, 0, 0), xfer.ErrInvalid},
		{"bad op", func() *xfer.Task { x := newTask(rec, xfer.OpRead, pool, 0, f, 0, 1); x.Req.Op = 9; return x }(), xfer.ErrInvalid},
		{"local out of bounds", newTask(rec, xfer.OpRead, pool, 1<<20-10, f, 0, 20), xfer.ErrInvalid},
		{"local offset overflow", newTask(rec, xfer.OpRead, pool, ^uint64(0)-5, f, 0, 20), xfer.ErrInvalid},
		{"file out of bounds", newTask(rec, xfer.OpWrite, pool, 0, f, 1<<20-10, 20), xfer.ErrInvalid},
		{"file offset overflow", newTask(rec, xfer.OpWrite, pool, 0, f, ^uint64(0)-5, 20), xfer.ErrInvalid},
		{"target not a file", func() *xfer.Task { x := newTask(rec, xfer.OpRead, pool, 0, f, 0, 1); x.Target = pool; return x }(), xfer.ErrInvalid},
		{"local not memory", func() *xfer.Task { x := newTask(rec, xfer.OpRead, pool, 0, f, 0, 1); x.Local = f; return x }(), xfer.ErrInvalid},
		{"nil segments", func() *xfer.Task {
			x := newTask(rec, xfer.OpRead, pool, 0, f, 0, 1)
			x.Local, x.Target = nil, nil
			return x
		}(), xfer.ErrInvalid},
		{"other transport's file", newTask(rec, xfer.OpRead, pool, 0, fOther, 0, 1), xfer.ErrInvalid},
		{"write to read-only", newTask(rec, xfer.OpWrite, pool, 0, ro, 0, 1), xfer.ErrPermission},
		{"notified write", func() *xfer.Task {
			x := newTask(rec, xfer.OpWrite, pool, 0, f, 0, 4096)
			x.Notify = []byte("nobody reads a file's notifications")
			return x
		}(), xfer.ErrNotSupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runOne(t, tr, rec, tc.task)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	// A nil task stops dispatch with an error; nothing before it is lost.
	good := newTask(rec, xfer.OpRead, pool, 0, f, 0, 10)
	before := int64(rec.Count())
	n, err := tr.Submit([]*xfer.Task{good, nil, good})
	if n != 1 || !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("Submit with nil = %d, %v", n, err)
	}
	waitEnded(t, rec, before+1, 5*time.Second)
}

func TestMisalignedDirect(t *testing.T) {
	dir := t.TempDir()
	tr := newTransport(t, Config{AllowedDirs: []string{dir}})
	f := openTestFile(t, tr, dir, true, 1<<20)
	offA, memA := f.Alignment()
	if offA < 512 || memA < 1 {
		t.Fatalf("alignment %d/%d", offA, memA)
	}
	pool := newMemSeg(t, 2, 1<<20)
	rec := newRecorder()
	for _, tc := range []struct {
		name              string
		loff, foff, lngth uint64
		mention           string
	}{
		{"file offset", 0, 100, 4096, "offset 100"},
		{"length", 0, 0, 4000, "length 4000"},
	} {
		_, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, pool, tc.loff, f, tc.foff, tc.lngth))
		if !errors.Is(err, xfer.ErrInvalid) || !errors.Is(err, ErrMisaligned) || !strings.Contains(err.Error(), tc.mention) {
			t.Fatalf("%s: got %v", tc.name, err)
		}
	}
	if memA > 1 {
		_, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, pool, 1, f, 0, 4096))
		if !errors.Is(err, ErrMisaligned) || !strings.Contains(err.Error(), "memory address") {
			t.Fatalf("memory: got %v", err)
		}
	}
	if st := tr.Stats()[0]; st.Submitted != 0 {
		t.Fatalf("misaligned requests reached the kernel: %+v", st)
	}
}

func TestAllowlist(t *testing.T) {
	base := t.TempDir()
	allowed := filepath.Join(base, "allowed")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{allowed, outside} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(allowed, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(allowed, "dirlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(allowed, "ok"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	tr := newTransport(t, Config{AllowedDirs: []string{allowed}})
	for _, p := range []string{
		filepath.Join(outside, "secret"),
		filepath.Join(allowed, "..", "outside", "secret"),
		filepath.Join(allowed, "link"),
		filepath.Join(allowed, "dirlink", "secret"),
		filepath.Join(allowed, "dirlink", "new"),
		allowed,
		"/etc/passwd",
		"/dev/null",
	} {
		f, err := tr.OpenFile(1, p, FileOptions{Create: true, Size: 4096})
		if !errors.Is(err, xfer.ErrPermission) {
			if f != nil {
				f.Close()
			}
			t.Fatalf("OpenFile(%s): got %v, want ErrPermission", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Fatal("a refused path was created")
	}
	f, err := tr.OpenFile(1, filepath.Join(allowed, "sub", "..", "ok"), FileOptions{})
	if err != nil {
		t.Fatalf("allowed path: %v", err)
	}
	if f.Kind() != xfer.KindFile || f.Size() != 4096 || f.ID() != 1 {
		t.Fatalf("file %v %d %d", f.Kind(), f.Size(), f.ID())
	}
	f.Close()
	if _, err := tr.OpenFile(0, filepath.Join(allowed, "ok"), FileOptions{}); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("id 0: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{Rings: -1}, {Rings: 65}, {Entries: 1}, {Entries: 1 << 20}, {DrainTimeout: -1},
		{SubmitWait: -1}, {MaxFixedBuffers: -2}, {MaxFixedFiles: 1 << 20},
		{DeferTaskrun: On, SingleIssuer: Off}, {CoopTaskrun: 7}, {Batch: -1}, {Batch: 1 << 20},
	} {
		if tr, err := New(c, nil); !errors.Is(err, ErrConfig) || !errors.Is(err, xfer.ErrInvalid) {
			if tr != nil {
				tr.Close()
			}
			t.Errorf("New(%+v) = %v, want ErrConfig", c, err)
		}
	}
	if _, err := New(Config{AllowedDirs: []string{"/nonexistent/tensorcast"}}, nil); !errors.Is(err, ErrConfig) {
		t.Errorf("missing AllowedDirs: %v", err)
	}
	var d Config
	d.setDefaults()
	if d.Rings != 1 || d.Entries != 256 || d.Batch != 4 || d.SQPoll || d.DrainTimeout != 5*time.Second {
		t.Errorf("defaults %+v", d)
	}
}

// TestRegistrationFallback: a refused registration leaves the segment
// usable through plain READ/WRITE.
func TestRegistrationFallback(t *testing.T) {
	dir := t.TempDir()
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, hooks: &testHooks{failRegister: true}})
	f := openTestFile(t, tr, dir, true, 1<<20)
	pool := newMemSeg(t, 2, 1<<20)
	if err := tr.RegisterBuffers(pool); err != nil {
		t.Fatalf("RegisterBuffers fallback returned %v", err)
	}
	rec := newRecorder()
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpWrite, pool, 0, f, 0, 8192)); err != nil || n != 8192 {
		t.Fatalf("write: %d %v", n, err)
	}
	if st := tr.Stats()[0]; st.Fixed != 0 {
		t.Fatalf("fixed buffers used after refused registration: %+v", st)
	}
	// A table too small for the segments: the first fits, the second falls back.
	tr2 := newTransport(t, Config{AllowedDirs: []string{dir}, MaxFixedBuffers: 1})
	a, b := newMemSeg(t, 5, 1<<20), newMemSeg(t, 6, 1<<20)
	if err := tr2.RegisterBuffers(a, b); err != nil {
		t.Fatal(err)
	}
	if tr2.registered() != 1 {
		t.Fatalf("want 1 registered segment, have %d", tr2.registered())
	}
	if err := tr2.UnregisterBuffers(5); err != nil {
		t.Fatal(err)
	}
	if err := tr2.RegisterBuffers(b); err != nil || tr2.registered() != 1 {
		t.Fatalf("re-register after unregister: %v", err)
	}
}

// TestFileLifecycle: a file closed while a reference is held keeps its
// descriptor until the last Release; its fixed slot is then reused.
func TestFileLifecycle(t *testing.T) {
	dir := t.TempDir()
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, MaxFixedFiles: 1})
	f, err := tr.OpenFile(1, filepath.Join(dir, "a"), FileOptions{Create: true, Size: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if !f.Fixed() {
		t.Fatal("file not registered")
	}
	if !f.Acquire() {
		t.Fatal("Acquire on open file failed")
	}
	f.Close()
	if f.Acquire() {
		t.Fatal("Acquire after Close succeeded")
	}
	if err := tr.fdOpen(f); err != nil {
		t.Fatalf("descriptor closed while referenced: %v", err)
	}
	f.Release()
	if tr.fdOpen(f) == nil {
		t.Fatal("descriptor still open after last Release")
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		g, err := tr.OpenFile(2, filepath.Join(dir, "b"), FileOptions{Create: true, Size: 4096})
		if err != nil {
			t.Fatal(err)
		}
		fixed := g.Fixed()
		g.Close()
		return fixed
	}, "the fixed-file slot coming back")
}

func TestFeatures(t *testing.T) {
	tr := newTransport(t, Config{})
	f := tr.Features()
	if f.Mask == 0 || f.Opcodes < 5 {
		t.Fatalf("features %+v", f)
	}
	if len(tr.Stats()) != 1 || tr.Name() != "uring" {
		t.Fatalf("stats %+v", tr.Stats())
	}
}

// TestBufferRegistrationOnSegment: a fixed-buffer registration lives in
// the segment's io_uring slot: one transport holds it (another uses plain
// READ/WRITE on that segment), the segment's teardown frees its table
// entries for the next segment, and Close hands the slot back.
func TestBufferRegistrationOnSegment(t *testing.T) {
	dir := t.TempDir()
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, MaxFixedBuffers: 1})
	if !tr.Features().FixedBuffers {
		testutil.Missing(t, testutil.IOUring, "the kernel's io_uring has no fixed buffers (READ_FIXED/WRITE_FIXED)")
	}
	f := openTestFile(t, tr, dir, true, 1<<20)
	a, b := newMemSeg(t, 5, 1<<20), newMemSeg(t, 6, 1<<20)
	if err := tr.RegisterBuffers(a); err != nil || tr.registered() != 1 {
		t.Fatalf("RegisterBuffers: %v, %d registered", err, tr.registered())
	}
	e, ok := a.Regs().Load(xfer.SlotURing).(*bufEntry)
	if !ok || e.t != tr {
		t.Fatal("the registration is not in the segment's slot")
	}
	rec := newRecorder()
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpWrite, a, 0, f, 0, 8192)); err != nil || n != 8192 {
		t.Fatalf("write: %d %v", n, err)
	}
	if st := tr.Stats()[0]; st.Fixed == 0 {
		t.Fatalf("a registered segment's write used no fixed buffer: %+v", st)
	}

	// Another transport finds the slot taken: plain READ/WRITE there.
	tr2 := newTransport(t, Config{AllowedDirs: []string{dir}})
	f2 := openTestFile(t, tr2, dir, true, 1<<20)
	if err := tr2.RegisterBuffers(a); err != nil || tr2.registered() != 0 {
		t.Fatalf("second transport: %v, %d registered", err, tr2.registered())
	}
	if n, err := runOne(t, tr2, rec, newTask(rec, xfer.OpWrite, a, 0, f2, 0, 8192)); err != nil || n != 8192 {
		t.Fatalf("write on the second transport: %d %v", n, err)
	}
	if st := tr2.Stats()[0]; st.Fixed != 0 {
		t.Fatalf("the second transport used the first one's fixed buffer: %+v", st)
	}

	// The segment's teardown releases its entry: b gets it.
	a.Regs().Teardown()
	if tr.registered() != 0 || a.Regs().Load(xfer.SlotURing) != nil {
		t.Fatal("the torn-down segment is still registered")
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		tr.bufMu.Lock()
		defer tr.bufMu.Unlock()
		return len(tr.bufFree) == 1
	}, "the torn-down segment's table entry freed")
	if err := tr.RegisterBuffers(b); err != nil || tr.registered() != 1 || b.Regs().Load(xfer.SlotURing) == nil {
		t.Fatalf("registering b in the freed entry: %v, %d registered", err, tr.registered())
	}
	before := tr.Stats()[0].Fixed
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, b, 0, f, 0, 8192)); err != nil || n != 8192 {
		t.Fatalf("read into b: %d %v", n, err)
	}
	if tr.Stats()[0].Fixed == before {
		t.Fatal("b's read used no fixed buffer")
	}

	// Close hands b's slot back: tr2 registers it.
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if b.Regs().Load(xfer.SlotURing) != nil {
		t.Fatal("a closed transport kept the segment's slot")
	}
	if err := tr2.RegisterBuffers(b); err != nil || tr2.registered() != 1 {
		t.Fatalf("registering b after the first transport closed: %v, %d registered", err, tr2.registered())
	}
}
