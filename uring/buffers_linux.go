//go:build linux

package uring

// Fixed buffers: registering memory segments with every ring, so that
// their I/O goes through READ_FIXED/WRITE_FIXED.

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
)

// bufEntry is a segment's fixed-buffer registration on one transport,
// kept in the segment's io_uring slot (xfer.SlotURing): prepIO reads it
// there, with one atomic load and no map.
type bufEntry struct {
	t    *Transport
	id   xfer.SegmentID
	regs *xfer.Regs // the segment's slots
	base uintptr
	size uint64
	idx  []uint16 // one registered buffer per GiB of the segment
	// unreg counts the rings still to clear the entries after a teardown.
	unreg atomic.Int32
}

var _ xfer.Registration = (*bufEntry)(nil)

// RegisterBuffers registers memory segments as fixed buffers on every ring
// so requests on them use READ_FIXED/WRITE_FIXED. A segment over 1 GiB
// takes one table entry per GiB. The registration lives in the segment's
// io_uring slot (xfer.Registered; a segment without slots, or whose slot
// another transport holds, stays on plain READ/WRITE) until
// UnregisterBuffers, Close, or the segment's teardown. When the kernel
// refuses (RLIMIT_MEMLOCK, table full) the segment stays usable through
// plain READ/WRITE; that is logged once and is not an error. It must not be
// called from Task.Done.
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
		regs := xfer.RegsOf(seg)
		if !t.fixedBufs.Load() || regs == nil {
			continue
		}
		if regs.Load(xfer.SlotURing) != nil {
			continue // registered here already, or by another transport
		}
		chunks := (len(mem) + bufChunk - 1) / bufChunk
		e := &bufEntry{t: t, id: seg.ID(), regs: regs, base: uintptr(unsafe.Pointer(&mem[0])), size: uint64(len(mem))}
		t.bufMu.Lock()
		if chunks > len(t.bufFree) {
			t.bufMu.Unlock()
			t.warnBufs(fmt.Errorf("fixed-buffer table full (%d entries)", t.cfg.MaxFixedBuffers))
			continue
		}
		e.idx = append([]uint16(nil), t.bufFree[len(t.bufFree)-chunks:]...)
		t.bufFree = t.bufFree[:len(t.bufFree)-chunks]
		t.bufMu.Unlock()
		iov := make([]unix.Iovec, chunks)
		for i := range iov {
			lo := i * bufChunk
			hi := min(lo+bufChunk, len(mem))
			iov[i].Base = &mem[lo]
			iov[i].SetLen(hi - lo)
		}
		err := t.updateBuffers(e.idx, iov)
		runtime.KeepAlive(mem)
		if err == nil {
			t.bufMu.Lock()
			t.bufs[e] = struct{}{}
			t.bufMu.Unlock()
			if regs.Set(xfer.SlotURing, e) {
				continue
			}
			// The segment tore down, or another transport took the
			// slot, while the rings registered it.
			t.bufMu.Lock()
			delete(t.bufs, e)
			t.bufMu.Unlock()
		} else {
			t.warnBufs(err)
		}
		t.updateBuffers(e.idx, make([]unix.Iovec, chunks))
		t.bufMu.Lock()
		t.bufFree = append(t.bufFree, e.idx...)
		t.bufMu.Unlock()
	}
	return nil
}

// UnregisterBuffers drops segments' fixed-buffer registrations (ids not
// registered here are ignored). Requests already in the kernel keep their
// pages pinned until they complete. It must not be called from Task.Done.
func (t *Transport) UnregisterBuffers(ids ...xfer.SegmentID) error {
	if t.closed.Load() {
		return xfer.ErrClosed
	}
	t.regMu.Lock()
	defer t.regMu.Unlock()
	var drop []*bufEntry
	t.bufMu.Lock()
	for e := range t.bufs {
		// Taken from the slot first: no SQE prepared after this uses
		// the entries the rings clear below.
		if slices.Contains(ids, e.id) && e.regs.Drop(xfer.SlotURing, e) {
			delete(t.bufs, e)
			drop = append(drop, e)
		}
	}
	t.bufMu.Unlock()
	var first error
	for _, e := range drop {
		if err := t.updateBuffers(e.idx, make([]unix.Iovec, len(e.idx))); err != nil && first == nil {
			first = err
		}
		t.bufMu.Lock()
		t.bufFree = append(t.bufFree, e.idx...)
		t.bufMu.Unlock()
	}
	return first
}

// Release implements xfer.Registration: the segment's teardown, which its
// slot emptied first. It may run on a poller (the engine releases a
// segment after Task.Done), so it never waits for one: each ring clears
// the entries when it next runs its commands, and the last one frees them.
func (e *bufEntry) Release() {
	t := e.t
	t.bufMu.Lock()
	_, ok := t.bufs[e]
	delete(t.bufs, e)
	t.bufMu.Unlock()
	if !ok {
		return // unregistered, or the transport closed
	}
	e.unreg.Store(int32(len(t.rings)))
	clear := make([]unix.Iovec, len(e.idx))
	for _, r := range t.rings {
		for i, idx := range e.idx {
			var after func()
			if i == len(e.idx)-1 {
				after = func() {
					if e.unreg.Add(-1) == 0 {
						t.bufMu.Lock()
						t.bufFree = append(t.bufFree, e.idx...)
						t.bufMu.Unlock()
					}
				}
			}
			if !r.post(&command{kind: cmdBuffer, idx: uint32(idx), iov: clear[i : i+1], after: after}) {
				return // closing: the table goes with the ring
			}
		}
	}
}

// dropBuffers takes every registration back from its segment's slot (the
// transport is closing; the tables go with the rings).
func (t *Transport) dropBuffers() {
	t.bufMu.Lock()
	defer t.bufMu.Unlock()
	for e := range t.bufs {
		e.regs.Drop(xfer.SlotURing, e)
	}
	clear(t.bufs)
}

// registered is how many segments are registered as fixed buffers.
func (t *Transport) registered() int {
	t.bufMu.Lock()
	defer t.bufMu.Unlock()
	return len(t.bufs)
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
