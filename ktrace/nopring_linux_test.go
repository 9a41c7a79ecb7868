package ktrace

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// nopRing is the smallest io_uring a test needs: it submits NOP requests
// and reaps their completions, through the raw ABI (io_uring_setup, mmap,
// io_uring_enter), so the test knows exactly which requests the kernel saw.
type nopRing struct {
	fd             int
	sq, cq, sqes   []byte
	p              ioUringParams
	sqTail, sqMask *uint32
	sqArray        []uint32
	cqHead, cqTail *uint32
	cqMask         uint32
}

type ioUringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  struct {
		head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
		userAddr                                                        uint64
	}
	cqOff struct {
		head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
		userAddr                                                        uint64
	}
}

func newNopRing(t *testing.T, entries uint32) *nopRing {
	t.Helper()
	r := &nopRing{}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&r.p)), 0)
	if errno != 0 {
		testutil.Missing(t, testutil.IOUring, "io_uring_setup: %v", errno)
	}
	r.fd = int(fd)
	t.Cleanup(r.close)
	var err error
	mmap := func(off int64, size int) []byte {
		b, e := unix.Mmap(r.fd, off, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if e != nil {
			err = e
		}
		return b
	}
	r.sq = mmap(0, int(r.p.sqOff.array+r.p.sqEntries*4))
	r.cq = mmap(0x8000000, int(r.p.cqOff.cqes+r.p.cqEntries*16))
	r.sqes = mmap(0x10000000, int(r.p.sqEntries*64))
	if err != nil {
		t.Fatalf("mmap io_uring: %v", err)
	}
	r.sqTail = (*uint32)(unsafe.Pointer(&r.sq[r.p.sqOff.tail]))
	r.sqMask = (*uint32)(unsafe.Pointer(&r.sq[r.p.sqOff.ringMask]))
	r.sqArray = unsafe.Slice((*uint32)(unsafe.Pointer(&r.sq[r.p.sqOff.array])), r.p.sqEntries)
	r.cqHead = (*uint32)(unsafe.Pointer(&r.cq[r.p.cqOff.head]))
	r.cqTail = (*uint32)(unsafe.Pointer(&r.cq[r.p.cqOff.tail]))
	r.cqMask = *(*uint32)(unsafe.Pointer(&r.cq[r.p.cqOff.ringMask]))
	return r
}

// nops submits n NOPs (n <= entries) with user_data base..base+n-1 and
// waits for their n completions.
func (r *nopRing) nops(t *testing.T, n int, base uint64) {
	t.Helper()
	tail := *r.sqTail
	for i := range n {
		idx := (tail + uint32(i)) & *r.sqMask
		sqe := r.sqes[idx*64 : idx*64+64]
		clear(sqe)
		sqe[0] = 0 // IORING_OP_NOP
		*(*uint64)(unsafe.Pointer(&sqe[32])) = base + uint64(i)
		r.sqArray[idx] = idx
	}
	// The kernel reads the tail with acquire semantics: a release store.
	storeRelease(r.sqTail, tail+uint32(n))
	got, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n), uintptr(n), 1 /* GETEVENTS */, 0, 0)
	if errno != 0 || int(got) != n {
		t.Fatalf("io_uring_enter: %d submitted, %v", got, errno)
	}
	head := loadAcquire(r.cqHead)
	if tail := loadAcquire(r.cqTail); tail-head != uint32(n) {
		t.Fatalf("%d completions, want %d", tail-head, n)
	}
	storeRelease(r.cqHead, head+uint32(n))
}

func (r *nopRing) close() {
	for _, b := range [][]byte{r.sq, r.cq, r.sqes} {
		if b != nil {
			unix.Munmap(b)
		}
	}
	unix.Close(r.fd)
}
