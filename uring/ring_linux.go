//go:build linux

package uring

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

// rawRing is one io_uring instance: the ring fd and the three shared
// mappings. It is used only by the goroutine that owns it (the ring's
// poller, locked to its OS thread), so it has no lock of its own.
//
// The head and tail indices live in memory shared with the kernel: they are
// read and written only with sync/atomic (the kernel reads our SQ tail and CQ
// head and writes the SQ head and CQ tail concurrently).
type rawRing struct {
	fd       int
	flags    uint32 // setup flags the kernel accepted
	features uint32

	sqMem, cqMem, sqeMem []byte

	sqHead, sqTail, sqFlags *uint32
	sqMask, sqEntries       uint32
	sqes                    []sqe
	// sqLocal is our private copy of the SQ tail: SQEs between *sqTail and
	// sqLocal are prepared but not yet published to the kernel.
	sqLocal uint32

	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []CQE
	// owed counts the SQEs prepared whose CQE has not been reaped yet.
	// Every request this package makes ends with exactly one CQE, so
	// while owed stays within the CQ the kernel never holds a completion
	// the CQ has no room for: one that overflows waits in kernel memory
	// until the next io_uring_enter that asks for events, and is lost
	// outright when that memory cannot be had (its request then never
	// ends).
	owed uint32
}

// newRawRing creates a ring with sq SQ entries and cq CQ entries and maps
// it. flags are setup flags; cq must be a power of two >= sq.
func newRawRing(sq, cq, flags, sqIdleMs uint32) (*rawRing, error) {
	var p params
	p.flags = flags | setupCQSize | setupClamp
	p.cqEntries = cq
	p.sqThreadIdle = sqIdleMs
	fd, err := sysSetup(sq, &p)
	if err != nil {
		return nil, err
	}
	r := &rawRing{fd: fd, flags: p.flags, features: p.features}
	if err := r.mapRings(&p); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *rawRing) mapRings(p *params) error {
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	cqSize := int(p.cqOff.cqes + p.cqEntries*uint32(unsafe.Sizeof(CQE{})))
	if p.features&featSingleMmap != 0 {
		sqSize = max(sqSize, cqSize)
		cqSize = sqSize
	}
	var err error
	r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return os.NewSyscallError("mmap sq ring", err)
	}
	if p.features&featSingleMmap != 0 {
		r.cqMem = r.sqMem
	} else {
		r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return os.NewSyscallError("mmap cq ring", err)
		}
	}
	sqeSize := int(p.sqEntries) * int(unsafe.Sizeof(sqe{}))
	r.sqeMem, err = unix.Mmap(r.fd, offSQEs, sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return os.NewSyscallError("mmap sqes", err)
	}
	r.sqHead = (*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.head]))
	r.sqTail = (*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.tail]))
	r.sqFlags = (*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.flags]))
	r.sqMask = *(*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.ringMask]))
	r.sqEntries = *(*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.ringEntries]))
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqeMem[0])), p.sqEntries)
	// The SQ index array maps ring positions to SQE slots; identity, set once.
	array := unsafe.Slice((*uint32)(unsafe.Pointer(&r.sqMem[p.sqOff.array])), p.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.sqLocal = atomic.LoadUint32(r.sqTail)

	r.cqHead = (*uint32)(unsafe.Pointer(&r.cqMem[p.cqOff.head]))
	r.cqTail = (*uint32)(unsafe.Pointer(&r.cqMem[p.cqOff.tail]))
	r.cqMask = *(*uint32)(unsafe.Pointer(&r.cqMem[p.cqOff.ringMask]))
	r.cqes = unsafe.Slice((*CQE)(unsafe.Pointer(&r.cqMem[p.cqOff.cqes])), p.cqEntries)
	return nil
}

// close unmaps the rings and closes the fd. The kernel cancels or waits for
// whatever is still in flight in its own exit work.
func (r *rawRing) close() error {
	var first error
	for _, m := range []*[]byte{&r.sqeMem, &r.cqMem, &r.sqMem} {
		if *m == nil {
			continue
		}
		if m == &r.cqMem && len(r.sqMem) > 0 && &r.cqMem[0] == &r.sqMem[0] {
			*m = nil
			continue
		}
		if err := unix.Munmap(*m); err != nil && first == nil {
			first = os.NewSyscallError("munmap", err)
		}
		*m = nil
	}
	if r.fd >= 0 {
		if err := unix.Close(r.fd); err != nil && first == nil {
			first = os.NewSyscallError("close", err)
		}
		r.fd = -1
	}
	return first
}

// sqSpace is how many SQEs can still be prepared before the SQ is full.
func (r *rawRing) sqSpace() uint32 {
	// atomic: the kernel advances the SQ head as it consumes entries.
	used := r.sqLocal - atomic.LoadUint32(r.sqHead)
	if invariants.Enabled && used > r.sqEntries {
		panic(fmt.Sprintf("uring invariant: %d SQEs queued in a ring of %d", used, r.sqEntries))
	}
	return r.sqEntries - used
}

// getSQE returns a zeroed SQE to fill, or nil when the SQ is full or
// the CQ has no room left for its completion (owed).
func (r *rawRing) getSQE() *sqe {
	if r.sqSpace() == 0 || r.owed >= uint32(len(r.cqes)) {
		return nil
	}
	e := &r.sqes[r.sqLocal&r.sqMask]
	*e = sqe{}
	r.sqLocal++
	r.owed++
	return e
}

// flush publishes the prepared SQEs to the kernel and returns how many
// are waiting for io_uring_enter to consume them.
func (r *rawRing) flush() uint32 {
	// atomic: the store of the tail is the release that makes the SQE
	// contents visible to the kernel.
	atomic.StoreUint32(r.sqTail, r.sqLocal)
	return r.sqLocal - atomic.LoadUint32(r.sqHead)
}

// needsWakeup reports whether an SQPOLL thread went to sleep and must be
// woken with IORING_ENTER_SQ_WAKEUP.
func (r *rawRing) needsWakeup() bool {
	// atomic: the kernel sets and clears SQ flags.
	return r.flags&setupSQPoll != 0 && atomic.LoadUint32(r.sqFlags)&sqNeedWakeup != 0
}

// Reap copies up to len(cqes) completions into the caller's slice, frees
// their CQ slots and returns how many it copied.
func (r *rawRing) Reap(cqes []CQE) int {
	// atomic: the kernel writes the CQ tail after it writes the CQE; the
	// load acquires the entries up to it.
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	if invariants.Enabled && tail-head > uint32(len(r.cqes)) {
		panic(fmt.Sprintf("uring invariant: CQ head %d tail %d exceed %d entries", head, tail, len(r.cqes)))
	}
	n := 0
	for head != tail && n < len(cqes) {
		cqes[n] = r.cqes[head&r.cqMask]
		head++
		n++
	}
	if n > 0 {
		// atomic: releasing the slots back to the kernel.
		atomic.StoreUint32(r.cqHead, head)
		if invariants.Enabled && uint32(n) > r.owed {
			panic(fmt.Sprintf("uring invariant: %d completions reaped, %d owed", n, r.owed))
		}
		r.owed -= min(uint32(n), r.owed)
	}
	return n
}

// cqReady reports how many completions wait in the CQ.
func (r *rawRing) cqReady() uint32 {
	// atomic: the kernel advances the tail; the head is ours.
	return atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead)
}

// enter submits toSubmit SQEs and, when wait is set, waits for at least
// one completion (or the timeout, if ts is non-nil and the kernel supports
// EXT_ARG). EINTR and EAGAIN/EBUSY are returned as is for the caller to retry.
func (r *rawRing) enter(toSubmit uint32, wait bool, ts *unix.Timespec) (int, unix.Errno) {
	var flags, minComplete uint32
	if wait {
		flags |= enterGetEvents
		minComplete = 1
	} else if r.flags&setupDeferTaskrun != 0 {
		// With DEFER_TASKRUN, completions are only posted when we ask for
		// events; asking for zero runs the pending task work.
		flags |= enterGetEvents
	}
	if r.flags&setupSQPoll != 0 {
		toSubmit = 0
		if r.needsWakeup() {
			flags |= enterSQWakeup
		}
		if !wait && flags&enterSQWakeup == 0 {
			return 0, 0
		}
	}
	if ts != nil && r.features&featExtArg != 0 {
		arg := getEventsArg{ts: uint64(uintptr(unsafe.Pointer(ts)))}
		n, errno := sysEnter(r.fd, toSubmit, minComplete, flags|enterExtArg, unsafe.Pointer(&arg), unsafe.Sizeof(arg))
		return n, errno
	}
	return sysEnter(r.fd, toSubmit, minComplete, flags, nil, 0)
}

func (r *rawRing) String() string {
	return fmt.Sprintf("ring(fd=%d sq=%d cq=%d flags=%#x)", r.fd, r.sqEntries, len(r.cqes), r.flags)
}
