//go:build linux && cgo

package rdma

// The verbs queues of a Transport: Device.NewTransport creates its
// completion queue and RC queue pairs; verbsQP and verbsCQ are the
// QueuePair and CompletionQueue the Transport drives.

/*
#include <stdlib.h>
#include "verbs_linux.h"
*/
import "C"

import (
	"errors"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NewTransport creates Config.QPs RC queue pairs on one completion queue.
// Connect (or the peer's Accept) then brings them up.
func (d *Device) NewTransport() (*Transport, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, ErrNoDevice
	}
	d.transports++
	d.mu.Unlock()
	fail := func(err error) (*Transport, error) {
		d.mu.Lock()
		d.transports--
		d.mu.Unlock()
		return nil, err
	}
	cfg := d.cfg
	depth := min(cfg.SendDepth, int(d.caps.max_qp_wr))
	for depth&(depth-1) != 0 {
		depth &= depth - 1
	}
	cfg.SendDepth = depth
	cqe := min(cfg.QPs*depth+cfg.QPs, int(d.caps.max_cqe))
	ccq, errno := C.tc_create_cq(d.ctx, C.int(cqe), C.int(cfg.PollBatch))
	if ccq == nil {
		return fail(os.NewSyscallError("ibv_create_cq", errno))
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		C.tc_destroy_cq(ccq)
		return fail(os.NewSyscallError("eventfd", err))
	}
	cq := &verbsCQ{q: ccq, efd: efd}
	cq.fds = []unix.PollFd{{Fd: int32(C.tc_cq_fd(ccq)), Events: unix.POLLIN}, {Fd: int32(efd), Events: unix.POLLIN}}
	rd := min(16, int(d.caps.max_qp_rd_atom), int(d.caps.max_qp_init_rd_atom))
	var qps []QueuePair
	for range cfg.QPs {
		cqp, errno := C.tc_create_qp(d.pd, ccq, C.int(depth))
		if cqp == nil {
			for _, q := range qps {
				_ = q.Destroy()
			}
			_ = cq.Destroy()
			return fail(os.NewSyscallError("ibv_create_qp", errno))
		}
		q := &verbsQP{q: cqp, port: d.cfg.Port, gidIndex: d.addr.GIDIndex, cfg: cfg, rdAtom: max(rd, 1)}
		q.buf = unsafe.Slice((*WorkRequest)(unsafe.Pointer(C.tc_wrs(cqp))), depth)
		qps = append(qps, q)
	}
	release := func() {
		d.mu.Lock()
		d.transports--
		d.mu.Unlock()
	}
	return newTransport("rdma", cfg, d.log, d.addr, cq, qps, release), nil
}

// verbsQP implements QueuePair over a libibverbs queue pair.
type verbsQP struct {
	q        *C.struct_tc_qp
	buf      []WorkRequest // over the C posting buffer
	port     int
	gidIndex int
	rdAtom   int
	cfg      Config
	posted   C.int // tc_post's out parameter; used under the queue pair's lock
}

func (q *verbsQP) WorkRequests() []WorkRequest { return q.buf }

func (q *verbsQP) Post(n int) (int, error) {
	// posted lives in q: a pointer to a local would escape per call.
	if r, err := C.tc_post(q.q, C.int(n), &q.posted); r != 0 {
		return int(q.posted), os.NewSyscallError("ibv_post_send", err)
	}
	return n, nil
}

func (q *verbsQP) Connect(local, remote *ConnInfo) error {
	if r, err := C.tc_modify_state(q.q, C.IBV_QPS_RESET); r != 0 {
		return os.NewSyscallError("ibv_modify_qp RESET", err)
	}
	if r, err := C.tc_to_init(q.q, C.int(q.port)); r != 0 {
		return os.NewSyscallError("ibv_modify_qp INIT", err)
	}
	mtu := min(local.MTU, remote.MTU)
	if r, err := C.tc_to_rtr(q.q, C.int(q.port), C.int(mtu), C.uint32_t(remote.QPN), C.uint32_t(remote.PSN),
		(*C.uint8_t)(unsafe.Pointer(&remote.GID[0])), C.int(q.gidIndex), C.uint16_t(remote.LID), C.int(q.rdAtom)); r != 0 {
		return os.NewSyscallError("ibv_modify_qp RTR", err)
	}
	if r, err := C.tc_to_rts(q.q, C.uint32_t(local.PSN), C.int(q.cfg.Timeout), C.int(q.cfg.RetryCount), C.int(q.rdAtom)); r != 0 {
		return os.NewSyscallError("ibv_modify_qp RTS", err)
	}
	return nil
}

func (q *verbsQP) Fail() error {
	if r, err := C.tc_modify_state(q.q, C.IBV_QPS_ERR); r != 0 {
		return os.NewSyscallError("ibv_modify_qp ERR", err)
	}
	return nil
}

func (q *verbsQP) Reset() error {
	if r, err := C.tc_modify_state(q.q, C.IBV_QPS_RESET); r != 0 {
		return os.NewSyscallError("ibv_modify_qp RESET", err)
	}
	return nil
}

func (q *verbsQP) QPN() uint32 { return uint32(C.tc_qpn(q.q)) }

func (q *verbsQP) Destroy() error {
	if r, err := C.tc_destroy_qp(q.q); r != 0 {
		return os.NewSyscallError("ibv_destroy_qp", err)
	}
	q.buf = nil
	return nil
}

// verbsCQ implements CompletionQueue: a completion queue whose channel fd is
// non-blocking, waited on with poll(2) together with an eventfd that wake
// writes (and nobody reads: once woken, every later wait returns false).
type verbsCQ struct {
	q   *C.struct_tc_cq
	efd int
	fds []unix.PollFd // preallocated for wait
}

func (c *verbsCQ) Poll(wcs []WorkCompletion) (int, error) {
	n, err := C.tc_poll(c.q, (*C.struct_tc_wc)(unsafe.Pointer(&wcs[0])), C.int(len(wcs)))
	if n < 0 {
		return 0, os.NewSyscallError("ibv_poll_cq", err)
	}
	return int(n), nil
}

func (c *verbsCQ) Arm() error {
	if r, err := C.tc_arm(c.q); r != 0 {
		return os.NewSyscallError("ibv_req_notify_cq", err)
	}
	return nil
}

func (c *verbsCQ) Wait() (bool, error) {
	for {
		c.fds[0].Revents, c.fds[1].Revents = 0, 0
		_, err := unix.Poll(c.fds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, os.NewSyscallError("poll", err)
		}
		if c.fds[1].Revents != 0 {
			return false, nil
		}
		if c.fds[0].Revents != 0 {
			if r, err := C.tc_take_event(c.q); r < 0 {
				return false, os.NewSyscallError("ibv_get_cq_event", err)
			}
			return true, nil
		}
	}
}

func (c *verbsCQ) Wake() {
	var one = [8]byte{1}
	_, _ = unix.Write(c.efd, one[:])
}

func (c *verbsCQ) Destroy() error {
	var errs []error
	if r, err := C.tc_destroy_cq(c.q); r != 0 {
		errs = append(errs, os.NewSyscallError("ibv_destroy_cq", err))
	}
	errs = append(errs, unix.Close(c.efd))
	return errors.Join(errs...)
}
