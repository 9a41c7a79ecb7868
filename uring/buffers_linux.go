//go:build linux

package uring

// Fixed buffers: registering memory segments with every ring, so that
// their I/O goes through READ_FIXED/WRITE_FIXED.

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
)

type bufEntry struct {
	base uintptr
	size uint64
	idx  []uint16 // one registered buffer per GiB of the segment
}

type bufTable struct {
	m map[xfer.SegmentID]bufEntry
}

// RegisterBuffers registers memory segments as fixed buffers on every ring
// so requests on them use READ_FIXED/WRITE_FIXED. A segment over 1 GiB
// takes one table entry per GiB. When the kernel refuses (RLIMIT_MEMLOCK,
// table full) the segment stays usable through plain READ/WRITE; that is
// logged once and is not an error. It must not be called from Task.Done.
func (t *Transport) RegisterBuffers(segs ...xfer.MemSegment) error {
	if t.closed.Load() {
		return xfer.ErrClosed
	}
	t.regMu.Lock()
	defer t.regMu.Unlock()
	for _, seg := range segs {
		if seg == nil {
			return fmt.Errorf("%w: nil segment", ErrBadRequest)
		}
		mem := seg.Bytes()
		if len(mem) == 0 {
			return fmt.Errorf("%w: segment %d has no memory", ErrBadRequest, seg.ID())
		}
		if !t.fixedBufs.Load() {
			continue
		}
		if _, ok := t.bufTab.Load().m[seg.ID()]; ok {
			continue
		}
		chunks := (len(mem) + bufChunk - 1) / bufChunk
		if chunks > len(t.bufFree) {
			t.warnBufs(fmt.Errorf("fixed-buffer table full (%d entries)", t.cfg.MaxFixedBuffers))
			continue
		}
		e := bufEntry{base: uintptr(unsafe.Pointer(&mem[0])), size: uint64(len(mem))}
		e.idx = append([]uint16(nil), t.bufFree[len(t.bufFree)-chunks:]...)
		iov := make([]unix.Iovec, chunks)
		for i := range iov {
			lo := i * bufChunk
			hi := min(lo+bufChunk, len(mem))
			iov[i].Base = &mem[lo]
			iov[i].SetLen(hi - lo)
		}
		if err := t.updateBuffers(e.idx, iov); err != nil {
			t.warnBufs(err)
			clear := make([]unix.Iovec, chunks)
			t.updateBuffers(e.idx, clear)
			continue
		}
		t.bufFree = t.bufFree[:len(t.bufFree)-chunks]
		old := t.bufTab.Load().m
		m := make(map[xfer.SegmentID]bufEntry, len(old)+1)
		for k, v := range old {
			m[k] = v
		}
		m[seg.ID()] = e
		t.bufTab.Store(&bufTable{m: m})
		runtime.KeepAlive(mem)
	}
	return nil
}

// UnregisterBuffers drops segments' fixed-buffer registrations (unknown ids
// are ignored). Requests already in the kernel keep their pages pinned
// until they complete. It must not be called from Task.Done.
func (t *Transport) UnregisterBuffers(ids ...xfer.SegmentID) error {
	if t.closed.Load() {
		return xfer.ErrClosed
	}
	t.regMu.Lock()
	defer t.regMu.Unlock()
	old := t.bufTab.Load().m
	m := make(map[xfer.SegmentID]bufEntry, len(old))
	for k, v := range old {
		m[k] = v
	}
	var drop []bufEntry
	for _, id := range ids {
		if e, ok := m[id]; ok {
			drop = append(drop, e)
			delete(m, id)
		}
	}
	t.bufTab.Store(&bufTable{m: m})
	var first error
	for _, e := range drop {
		if err := t.updateBuffers(e.idx, make([]unix.Iovec, len(e.idx))); err != nil && first == nil {
			first = err
		}
		t.bufFree = append(t.bufFree, e.idx...)
	}
	return first
}

func (t *Transport) warnBufs(err error) {
	if !t.warnedBufs {
		t.warnedBufs = true
		t.log.Warn("uring: buffer registration failed, segment uses plain READ/WRITE", "err", err)
	}
}

// updateBuffers sets registered-buffer entries idx[i] to iov[i] on every
// ring (a zero iovec clears an entry).
func (t *Transport) updateBuffers(idx []uint16, iov []unix.Iovec) error {
	if t.cfg.hooks != nil && t.cfg.hooks.failRegister && iov[0].Base != nil {
		return os.NewSyscallError("io_uring_register", unix.ENOMEM)
	}
	for _, r := range t.rings {
		for i := range idx {
			if err := r.do(&command{kind: cmdBuffer, idx: uint32(idx[i]), iov: iov[i : i+1]}); err != nil {
				return err
			}
		}
	}
	return nil
}
