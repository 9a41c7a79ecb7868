package xfer

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// memfdSeg is a MemSegment over a shared mapping of a memfd, like a client
// buffer; shrinking the memfd makes the mapping's tail fault.
type memfdSeg struct {
	countSeg
	fd  int
	mem []byte
}

func newMemfdSeg(t *testing.T, id SegmentID, size int) *memfdSeg {
	t.Helper()
	fd, err := unix.MemfdCreate("tensorcast-xfer-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skipf("memfd_create unavailable: %v", err)
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
	s := &memfdSeg{countSeg: countSeg{id: id, kind: KindClient, buf: mem}, fd: fd, mem: mem}
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
		cfg  LocalConfig
	}{
		{"inline", LocalConfig{InlineBytes: 2 * size}},
		{"workers", LocalConfig{InlineBytes: -1, ChunkBytes: 64 << 10}},
	} {
		t.Run(p.name, func(t *testing.T) {
			l := NewLocal(p.cfg, nil)
			defer l.Close()
			f := newFixture(t, Config{}, oneRouter{l})
			client := newMemfdSeg(t, 3, size)
			pool := newSeg(4, 3*size)
			for _, s := range []Segment{client, pool} {
				if err := f.reg.Add(s); err != nil {
					t.Fatal(err)
				}
			}
			fill(client.mem, 3)
			// Only the first half survives.
			if err := unix.Ftruncate(client.fd, size/2); err != nil {
				t.Fatal(err)
			}
			reqs := []Request{
				{Op: OpWrite, Local: 3, Target: 4, Length: size / 4},                                                  // within the file
				{Op: OpWrite, Local: 3, Target: 4, TargetOffset: size, Length: size},                                  // runs past it (read fault)
				{Op: OpRead, Local: 3, LocalOffset: size / 2, Target: 4, TargetOffset: 2 * size, Length: 4096},        // write fault
				{Op: OpRead, Local: 3, LocalOffset: size/2 - 8, Target: 4, TargetOffset: 2*size + 8192, Length: 4096}, // straddles the end
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
			if st := f.status(t, id, 0); st.State != StateCompleted {
				t.Fatalf("task within the file: %+v", st)
			}
			for i := 1; i < len(reqs); i++ {
				if st := f.status(t, id, i); st.State != StateFailed || !errors.Is(st.Err, ErrFault) {
					t.Fatalf("task %d: %+v", i, st)
				}
			}
			if l.Faults() != 3 {
				t.Fatalf("Faults() = %d, want 3", l.Faults())
			}
			checkRefs(t, &client.countSeg, pool, f.a, f.b)
		})
	}
}
