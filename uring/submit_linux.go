//go:build linux

package uring

// Submission: validating a task (resolve), queueing it in a free slot for
// the poller (submit, waitRoom), and filling its SQE (prepIO).

import (
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
)

// prepared is a validated task, ready to fill a slot.
type prepared struct {
	addr, base uintptr
	regs       *xfer.Regs
	off, total uint64
	align      uint32 // the file's O_DIRECT offset alignment, 0 when buffered
	fd         int32
	fixedFile  bool
	op         uint8
}

// resolve validates a task and works out its SQE parameters.
func (t *Transport) resolve(task *xfer.Task, p *prepared) error {
	req := &task.Req
	if task.Notify != nil {
		// A file has nobody to deliver a notification to.
		return xfer.ErrNoNotify
	}
	switch req.Op {
	case xfer.OpRead:
		p.op = opRead
	case xfer.OpWrite:
		p.op = opWrite
	default:
		return fmt.Errorf("%w: op %d", ErrBadRequest, req.Op)
	}
	if req.Length == 0 {
		return fmt.Errorf("%w: zero length", ErrBadRequest)
	}
	local, ok := task.Local.(xfer.MemSegment)
	if !ok || local == nil {
		return fmt.Errorf("%w: local side must be a memory segment", ErrBadRequest)
	}
	f, ok := task.Target.(*File)
	if !ok || f == nil || f.t != t {
		return fmt.Errorf("%w: target must be a file opened by this transport", ErrBadRequest)
	}
	mem := local.Bytes()
	if req.LocalOffset > uint64(len(mem)) || req.Length > uint64(len(mem))-req.LocalOffset {
		return fmt.Errorf("%w: local range %d+%d beyond segment size %d", ErrBadRequest, req.LocalOffset, req.Length, len(mem))
	}
	if req.TargetOffset > f.size || req.Length > f.size-req.TargetOffset {
		return fmt.Errorf("%w: file range %d+%d beyond size %d", ErrBadRequest, req.TargetOffset, req.Length, f.size)
	}
	if p.op == opWrite && f.readOnly {
		return fmt.Errorf("%w: file %s is read-only", xfer.ErrPermission, f.path)
	}
	p.base = uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	p.addr = p.base + uintptr(req.LocalOffset)
	p.align = 0
	if f.direct {
		p.align = f.offAlign
		oa, ma := uint64(f.offAlign), uint64(f.memAlign)
		switch {
		case req.TargetOffset%oa != 0:
			return fmt.Errorf("%w: file offset %d is not a multiple of %d", ErrMisaligned, req.TargetOffset, oa)
		case req.Length%oa != 0:
			return fmt.Errorf("%w: length %d is not a multiple of %d", ErrMisaligned, req.Length, oa)
		case uint64(p.addr)%ma != 0:
			return fmt.Errorf("%w: memory address %#x is not a multiple of %d", ErrMisaligned, p.addr, ma)
		}
	}
	p.regs = xfer.RegsOf(local)
	p.off = req.TargetOffset
	p.total = req.Length
	if f.fixed >= 0 {
		p.fd, p.fixedFile = f.fixed, true
	} else {
		p.fd, p.fixedFile = int32(f.fd), false
	}
	return nil
}

// submit queues tasks on r. own says the caller is r's own poller (its
// guest, Task.Home): then a full ring never waits for room, which only
// that same thread could make, and ErrQueueFull ends the rest at once. A
// full ring also checks the calling thread, for callers on the poller
// that do not say so (the store's L2 I/O started by a guest's queue).
func (r *ring) submit(tasks []*xfer.Task, own bool) (int, error) {
	n := 0
	locked := false
	unlock := func() {
		wake := r.wakeLocked()
		r.mu.Unlock()
		if wake {
			r.wake()
		}
	}
	for n < len(tasks) {
		task := tasks[n]
		if task == nil {
			if locked {
				unlock()
			}
			return n, fmt.Errorf("%w: nil task at %d", ErrBadRequest, n)
		}
		var p prepared
		if err := r.t.resolve(task, &p); err != nil {
			if locked {
				unlock()
				locked = false
			}
			r.nFailed.Add(1)
			task.Done(0, err)
			n++
			continue
		}
		if !locked {
			r.mu.Lock()
			locked = true
		}
		if r.closing {
			r.mu.Unlock()
			return n, xfer.ErrClosed
		}
		if err := r.failure.Load(); err != nil {
			r.mu.Unlock()
			return n, err
		}
		if len(r.free) == 0 && (own || unix.Gettid() == r.tid) {
			// The poller itself (its guest, or a Done callback that
			// submits more than it was handed back) would wait for room
			// only it can make.
			r.mu.Unlock()
			return n, fmt.Errorf("%w: %d slots of ring %d in use", ErrQueueFull, len(r.slots), r.id)
		}
		if len(r.free) == 0 {
			// Backpressure: let the poller see what is queued, then wait.
			wake := r.wakeLocked()
			if wake {
				r.mu.Unlock()
				r.wake()
				r.mu.Lock()
			}
			if err := r.waitRoom(); err != nil {
				r.mu.Unlock()
				return n, err
			}
			continue
		}
		idx := r.free[len(r.free)-1]
		r.free = r.free[:len(r.free)-1]
		s := &r.slots[idx]
		s.addr, s.localBase, s.regs = p.addr, p.base, p.regs
		s.off, s.total, s.done, s.align = p.off, p.total, 0, p.align
		s.fd, s.fixedFile, s.op = p.fd, p.fixedFile, p.op
		s.retries, s.inKernel = 0, false
		s.gen.Add(1)
		s.task = task
		task.Tag = uint64(r.id)<<32 | uint64(idx)
		r.pending = append(r.pending, idx)
		n++
		if len(r.free) > 0 && r.waiters > 0 && n == len(tasks) {
			select {
			case r.room <- struct{}{}:
			default:
			}
		}
	}
	if locked {
		unlock()
	}
	return n, nil
}

// waitRoom waits, bounded by Config.SubmitWait, for the poller to free a
// slot. Called and returns with mu held.
func (r *ring) waitRoom() error {
	if len(r.free) > 0 {
		return nil // freed while mu was dropped to wake the poller
	}
	r.waiters++
	r.mu.Unlock()
	timer := time.NewTimer(r.t.cfg.SubmitWait)
	var err error
	select {
	case <-r.room:
	case <-r.stop:
		err = xfer.ErrClosed
	case <-timer.C:
		err = ErrQueueFull
	}
	timer.Stop()
	r.mu.Lock()
	r.waiters--
	if err == nil && r.closing {
		err = xfer.ErrClosed
	}
	return err
}

func (r *ring) prepIO(idx int32) bool {
	e := r.raw.getSQE()
	if e == nil {
		return false
	}
	s := &r.slots[idx]
	n := s.total - s.done
	if n > maxIO {
		n = maxIO
	}
	addr := s.addr + uintptr(s.done)
	e.opcode = s.op
	e.fd = s.fd
	if s.fixedFile {
		e.flags = sqeFixedFile
	}
	e.off = s.off + s.done
	e.addr = uint64(addr)
	if s.regs != nil {
		// The segment's slot, read here on the poller: a registration
		// taken back is out of the slot before the commands that clear
		// its entries reach this ring.
		if be, ok := s.regs.Load(xfer.SlotURing).(*bufEntry); ok && be.t == r.t && be.base == s.localBase {
			rel := uint64(addr - be.base)
			chunk := rel / bufChunk
			if end := (chunk + 1) * bufChunk; rel+n > end {
				n = end - rel
			}
			if s.op == opRead {
				e.opcode = opReadFixed
			} else {
				e.opcode = opWriteFixed
			}
			e.bufIndex = be.idx[chunk]
			r.nFixed.Add(1)
		}
	}
	e.len = uint32(n)
	e.userData = r.userData(idx)
	s.ud = e.userData
	s.inKernel = true
	r.inKernel++
	r.nSubmitted.Add(1)
	return true
}
