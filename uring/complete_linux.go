//go:build linux

package uring

// Completion: what a CQE means for its slot (complete, ioError), and ending
// tasks outside the ring's lock (finish, flushFinished).

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/xfer"
)

// finish records a task's end; flushFinished frees the slots and calls
// Task.Done outside the lock.
func (r *ring) finish(idx int32, n uint64, err error) {
	s := &r.slots[idx]
	r.fin = append(r.fin, finished{idx: idx, task: s.task, n: n, err: err})
	r.inflight--
	if err == nil {
		r.nCompleted.Add(1)
	} else {
		r.nFailed.Add(1)
	}
}

func (r *ring) flushFinished() {
	if len(r.fin) == 0 {
		return
	}
	r.mu.Lock()
	for i := range r.fin {
		idx := r.fin[i].idx
		s := &r.slots[idx]
		if invariants.Enabled && (s.task == nil || s.inKernel || len(r.free) >= len(r.slots)) {
			panic(fmt.Sprintf("uring invariant: freeing slot %d twice or while in the kernel", idx))
		}
		s.task = nil
		s.cancelQueued = false
		s.canceled.Store(false)
		r.free = append(r.free, idx)
	}
	if r.waiters > 0 {
		select {
		case r.room <- struct{}{}:
		default:
		}
	}
	r.mu.Unlock()
	for i := range r.fin {
		f := &r.fin[i]
		f.task.Done(f.n, f.err)
		*f = finished{}
	}
	r.fin = r.fin[:0]
}

func (r *ring) complete(c *CQE, draining bool) {
	switch {
	case c.UserData == udWake:
		r.wakeArmed = false
		r.nWakeups.Add(1)
		r.mu.Lock()
		r.wakeSent = false
		r.mu.Unlock()
		return
	case c.UserData == udCancel:
		return
	case c.UserData == udWaitCancel:
		r.waits--
		return
	case c.UserData&^udTokenMask == udFutex:
		r.waits--
		if r.host != nil {
			r.host.Fired(uint32(c.UserData), c.Res)
		}
		return
	}
	ui, gen := refSlot(c.UserData &^ TracedUserData)
	if ui >= uint64(len(r.slots)) {
		return
	}
	idx := int32(ui)
	s := &r.slots[idx]
	if !s.current(gen) {
		// For a task the slot held before: never the one it holds now.
		return
	}
	if !s.inKernel {
		if invariants.Enabled {
			panic(fmt.Sprintf("uring invariant: completion for slot %d that is not in the kernel", idx))
		}
		return
	}
	s.inKernel = false
	r.inKernel--
	res := c.Res
	if h := r.t.cfg.hooks; h != nil && h.result != nil {
		res = h.result(s.op, res)
	}
	if res < 0 {
		errno := unix.Errno(-res)
		switch {
		case (errno == unix.EAGAIN || errno == unix.EINTR) && !draining && s.retries < maxRetries:
			s.retries++
			r.nResubmits.Add(1)
			r.resub = append(r.resub, idx)
		case errno == unix.ECANCELED && draining:
			r.finish(idx, s.done, errClosedInFlight)
		case errno == unix.ECANCELED && s.canceled.Load():
			r.finish(idx, s.done, xfer.ErrCanceled)
		case errno == unix.ECANCELED && s.retries < maxRetries:
			// Nobody asked: the kernel gave up on the request, as io-wq
			// does with work queued when it cannot start a worker (a
			// buffered write to a file system without async writes
			// goes there; the thread creation fails while the ring's
			// thread has a signal pending). A read or write at its own
			// offset is safe to send again.
			s.retries++
			r.nResubmits.Add(1)
			r.nKernelCancels.Add(1)
			r.resub = append(r.resub, idx)
			if !r.kernelCancelLogged {
				r.kernelCancelLogged = true
				r.t.log.Warn("uring: the kernel canceled a request nobody canceled; sent again (logged once per ring)",
					"ring", r.id, "op", opName(s.op), "offset", s.off+s.done)
			}
		default:
			r.finish(idx, s.done, r.ioError(s, errno))
		}
		return
	}
	if res == 0 {
		r.finish(idx, s.done, fmt.Errorf("%w: %s of %d bytes at file offset %d returned 0", ErrShortIO, opName(s.op), s.total-s.done, s.off+s.done))
		return
	}
	s.done += uint64(res)
	switch {
	case s.done >= s.total:
		r.finish(idx, s.total, nil)
	case draining:
		r.finish(idx, s.done, errClosedInFlight)
	case s.canceled.Load():
		r.finish(idx, s.done, xfer.ErrCanceled)
	case s.align > 1 && (s.off+s.done)%uint64(s.align) != 0:
		// A direct file's transfer stops short only at its end (the
		// file shrank since it was opened): the rest would start at an
		// offset direct I/O refuses (EINVAL), and there is nothing there.
		r.finish(idx, s.done, fmt.Errorf("%w: %s of %d bytes at file offset %d stopped at offset %d, where the file ends",
			ErrShortIO, opName(s.op), s.total, s.off, s.off+s.done))
	default:
		r.nResubmits.Add(1)
		r.resub = append(r.resub, idx)
	}
}

func opName(op uint8) string {
	if op == opWrite {
		return "write"
	}
	return "read"
}

func (r *ring) ioError(s *slot, errno unix.Errno) error {
	return fmt.Errorf("uring: %s at file offset %d: %w", opName(s.op), s.off+s.done,
		os.NewSyscallError("io_uring "+opName(s.op), errno))
}
