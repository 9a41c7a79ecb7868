package xfer_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// memfdSeg is a MemSegment over a shared mapping of a memfd, like a client
// buffer; shrinking the memfd makes the mapping's tail fault.
type memfdSeg struct {
	*xfertest.Segment
	fd  int
	mem []byte
}

func newMemfdSeg(t *testing.T, id xfer.SegmentID, size int) *memfdSeg {
	t.Helper()
	fd, err := unix.MemfdCreate("tensorcast-xfer-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatalf("memfd_create (the daemon's pools and client buffers are memfds): %v", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	s := &memfdSeg{Segment: xfertest.SegmentOf(id, xfer.KindClient, mem), fd: fd, mem: mem}
	t.Cleanup(func() {
		unix.Munmap(mem)
		unix.Close(fd)
	})
	return s
}

// TestLocalFault: a client shrinks its memfd under a copy; the task ends
// Failed with ErrFault and the daemon does not crash, on both paths.
func TestLocalFault(t *testing.T) {
	const size = 1 << 20
	for _, p := range []struct {
		name string
		cfg  xfer.LocalConfig
	}{
		{"inline", xfer.LocalConfig{InlineBytes: 2 * size}},
		{"workers", xfer.LocalConfig{InlineBytes: -1, ChunkBytes: 64 << 10}},
	} {
		t.Run(p.name, func(t *testing.T) {
			l := xfer.NewLocal(p.cfg, nil)
			defer l.Close()
			f := newFixture(t, xfer.Config{}, xfertest.RouteAll(l))
			client := newMemfdSeg(t, 3, size)
			pool := xfertest.NewSegment(4, 3*size)
			for _, s := range []xfer.Segment{client, pool} {
				if err := f.reg.Add(s); err != nil {
					t.Fatal(err)
				}
			}
			fill(client.mem, 3)
			// Only the first half survives.
			if err := unix.Ftruncate(client.fd, size/2); err != nil {
				t.Fatal(err)
			}
			reqs := []xfer.Request{
				{Op: xfer.OpWrite, Local: 3, Target: 4, Length: size / 4},                                                  // within the file
				{Op: xfer.OpWrite, Local: 3, Target: 4, TargetOffset: size, Length: size},                                  // runs past it (read fault)
				{Op: xfer.OpRead, Local: 3, LocalOffset: size / 2, Target: 4, TargetOffset: 2 * size, Length: 4096},        // write fault
				{Op: xfer.OpRead, Local: 3, LocalOffset: size/2 - 8, Target: 4, TargetOffset: 2*size + 8192, Length: 4096}, // straddles the end
			}
			id, _ := f.e.AllocateBatch(len(reqs))
			res := make([]error, len(reqs))
			if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
				t.Fatal(err)
			}
			sum, err := f.e.Wait(id, time.Now().Add(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if sum.Completed != 1 || sum.Failed != 3 {
				t.Fatalf("summary %+v", sum)
			}
			if st := f.status(t, id, 0); st.State != xfer.StateCompleted {
				t.Fatalf("task within the file: %+v", st)
			}
			for i := 1; i < len(reqs); i++ {
				if st := f.status(t, id, i); st.State != xfer.StateFailed || !errors.Is(st.Err, xfer.ErrFault) {
					t.Fatalf("task %d: %+v", i, st)
				}
			}
			if l.Faults() != 3 {
				t.Fatalf("Faults() = %d, want 3", l.Faults())
			}
			xfertest.CheckRefs(t, client.Segment, pool, f.a, f.b)
		})
	}
}

// TestLocalFaultLarge: a task far larger than the inline bound over a
// client buffer that faults from its middle on ends once with ErrFault,
// whether the fault comes first on the submitting goroutine or later on
// the workers.
func TestLocalFaultLarge(t *testing.T) {
	const size, good = 16 << 20, 8 << 20
	for _, c := range []struct {
		name string
		off  uint64
	}{
		{"middle", 0},          // the first 8 MiB copy, the rest fault
		{"first", good + 4096}, // every chunk faults, the submitter's first
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newGatedLocal(t, gatedCfg)
			client := newMemfdSeg(t, 3, size)
			pool := xfertest.NewSegment(4, size)
			fill(client.mem, 4)
			if err := unix.Ftruncate(client.fd, good); err != nil {
				t.Fatal(err)
			}
			d := xfertest.NewRecorder()
			n := size - c.off
			tk := &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, LocalOffset: c.off, Length: n}, Local: client, Target: pool}
			tk.SetCompleter(d)
			if k, err := l.Submit([]*xfer.Task{tk}); k != 1 || err != nil {
				t.Fatalf("Submit: %d %v", k, err)
			}
			if here := l.here.Load(); here > uint64(gatedCfg.InlineBytes) {
				t.Errorf("the submitting goroutine copied %d bytes, bound %d", here, gatedCfg.InlineBytes)
			}
			l.release()
			d.Wait(t, 1)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if d.Ends(tk) != 1 || !errors.Is(d.Err(tk), xfer.ErrFault) || d.N(tk) != 0 {
				t.Fatalf("task ended %d times, %d bytes, %v", d.Ends(tk), d.N(tk), d.Err(tk))
			}
			if l.Faults() != 1 {
				t.Fatalf("Faults() = %d, want 1", l.Faults())
			}
			if c.off == 0 && !bytes.Equal(pool.Bytes()[:good], client.mem[:good]) {
				t.Fatal("the bytes before the fault differ")
			}
		})
	}
}
