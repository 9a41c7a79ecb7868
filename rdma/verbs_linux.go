//go:build linux && cgo

package rdma

// The Go side of the verbs boundary, the one file that calls C: loading
// libibverbs (with the ABI check of the structs shared with C), opening a
// device port, registering memory, and the verbs QueuePair and
// CompletionQueue under a Transport. The C side is verbs_linux.c, declared
// in verbs_linux.h.

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "verbs_linux.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
)

// The status table of wcstatus.go follows the C enum.
var _ = [1]struct{}{}[WCTMRndvIncomplete-C.IBV_WC_TM_RNDV_INCOMPLETE]
var _ = [1]struct{}{}[C.IBV_WC_TM_RNDV_INCOMPLETE-WCTMRndvIncomplete]
var _ = [1]struct{}{}[WCWRFlushErr-C.IBV_WC_WR_FLUSH_ERR]
var _ = [1]struct{}{}[WCRetryExcErr-C.IBV_WC_RETRY_EXC_ERR]

// abiCheck compares the Go mirrors of struct tc_wr and struct tc_wc with
// the C layout.
func abiCheck() error {
	var w WorkRequest
	wr := []uintptr{unsafe.Offsetof(w.id), unsafe.Offsetof(w.laddr), unsafe.Offsetof(w.raddr),
		unsafe.Offsetof(w.length), unsafe.Offsetof(w.lkey), unsafe.Offsetof(w.rkey),
		unsafe.Offsetof(w.op), unsafe.Offsetof(w.signaled), unsafe.Sizeof(w)}
	for i, off := range wr {
		if c := uintptr(C.tc_wr_off(C.int(i))); c != off {
			return fmt.Errorf("rdma: struct tc_wr field %d at %d in C, %d in Go", i, c, off)
		}
	}
	var c WorkCompletion
	wc := []uintptr{unsafe.Offsetof(c.id), unsafe.Offsetof(c.status), unsafe.Offsetof(c.vendor),
		unsafe.Offsetof(c.byteLen), unsafe.Sizeof(c)}
	for i, off := range wc {
		if cc := uintptr(C.tc_wc_off(C.int(i))); cc != off {
			return fmt.Errorf("rdma: struct tc_wc field %d at %d in C, %d in Go", i, cc, off)
		}
	}
	return nil
}

// library is the process-wide libibverbs handle, loaded once.
var library struct {
	once sync.Once
	err  error
}

// loadLibrary opens libibverbs once; later calls return the first result.
func loadLibrary() error {
	library.once.Do(func() {
		if err := abiCheck(); err != nil {
			library.err = err
			return
		}
		if msg := C.tc_load(); msg != nil {
			library.err = fmt.Errorf("%w (%s)", ErrNoLibrary, C.GoString(msg))
		}
	})
	return library.err
}

// noLibraryLogged makes "libibverbs not found" appear once per process.
var noLibraryLogged sync.Once

// Device is an opened RDMA device port with its protection domain. Regions
// and transports made from it belong to it and must be released before
// Close.
type Device struct {
	ctx  *C.struct_ibv_context
	pd   *C.struct_ibv_pd
	name string
	cfg  Config
	addr Addr
	caps C.struct_tc_caps
	log  *slog.Logger

	mu         sync.Mutex // guards the fields below
	regions    int
	transports int
	closed     bool
}

// Open opens the configured device (or the first one), queries its port
// and picks the RoCE v2 GID (Config.GIDIndex overrides). On a host without
// libibverbs it fails with ErrNoLibrary, and logs that once.
func Open(cfg Config, log *slog.Logger) (*Device, error) {
	portSet := cfg.Port != 0
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := loadLibrary(); err != nil {
		noLibraryLogged.Do(func() { log.Warn("rdma: libibverbs not found; RDMA is off, tcp only", "err", err) })
		return nil, err
	}
	if cfg.Device == "" {
		// The first device with an active port, as the kernel lists them.
		if name, port, ok := FirstActive(ListDevices()); ok {
			cfg.Device = name
			if !portSet {
				cfg.Port = port
			}
		}
	}
	cname := C.CString(cfg.Device)
	defer C.free(unsafe.Pointer(cname))
	var found [64]C.char
	ctx, errno := C.tc_open(cname, &found[0], C.size_t(len(found)))
	if ctx == nil {
		if cfg.Device == "" {
			return nil, fmt.Errorf("%w: libibverbs lists none (%v)", ErrNoDevice, errno)
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrNoDevice, cfg.Device, os.NewSyscallError("ibv_open_device", errno))
	}
	d := &Device{ctx: ctx, name: C.GoString(&found[0]), cfg: cfg, log: log}
	if err := d.setup(); err != nil {
		if d.pd != nil {
			C.tc_dealloc_pd(d.pd)
		}
		C.tc_close_device(ctx)
		return nil, err
	}
	log.Info("rdma: device open", "device", d.name, "port", cfg.Port, "gid", d.addr.GID.String(),
		"gid_index", d.addr.GIDIndex, "mtu", d.addr.MTU.Bytes(), "max_qp_wr", int(d.caps.max_qp_wr))
	return d, nil
}

func (d *Device) setup() error {
	if r, err := C.tc_query_caps(d.ctx, &d.caps); r != 0 {
		return os.NewSyscallError("ibv_query_device", err)
	}
	var state, mtu C.int
	var lid C.uint16_t
	if r, err := C.tc_query_port(d.ctx, C.uint8_t(d.cfg.Port), &state, &mtu, &lid); r != 0 {
		return fmt.Errorf("%w: %s port %d: %v", ErrNoDevice, d.name, d.cfg.Port, os.NewSyscallError("ibv_query_port", err))
	}
	if state != C.IBV_PORT_ACTIVE {
		return fmt.Errorf("%w: %s port %d is not active (state %d)", ErrNoDevice, d.name, d.cfg.Port, int(state))
	}
	g, err := ChooseGID(d.name, d.cfg.Port, d.cfg.Netdev, d.cfg.GID)
	if err != nil {
		return err
	}
	// What the device itself says for that index must agree with sysfs.
	var raw GID
	if r, err := C.tc_query_gid(d.ctx, C.uint8_t(d.cfg.Port), C.int(g.Index), (*C.uint8_t)(unsafe.Pointer(&raw[0]))); r != 0 {
		return os.NewSyscallError("ibv_query_gid", err)
	}
	if raw != g.GID {
		return fmt.Errorf("%w: gid %d is %s on the device, %s in sysfs", ErrNoGID, g.Index, raw, g.GID)
	}
	d.addr = Addr{GID: g.GID, GIDIndex: g.Index, LID: uint16(lid), MTU: MTU(mtu)}
	pd, errno := C.tc_alloc_pd(d.ctx)
	if pd == nil {
		return os.NewSyscallError("ibv_alloc_pd", errno)
	}
	d.pd = pd
	return nil
}

// Name is the device name (rxe0, mlx5_0).
func (d *Device) Name() string { return d.name }

// Addr is the port's address: the chosen GID and its index, LID, MTU.
func (d *Device) Addr() Addr { return d.addr }

// Register registers mem (which must not be Go-heap memory: an mmap'd
// segment) as one MR per Config.ChunkSize, RegisterWorkers at a time, open
// to the peer's READ and WRITE (RegisterAccess with AccessRemote).
func (d *Device) Register(mem []byte) (*Region, error) { return d.RegisterAccess(mem, AccessRemote) }

// RegisterAccess is Register with the remote access the MRs grant: a
// region registered with AccessLocal can only be the local side of
// requests, and the hardware refuses a peer's READ of a region without
// AccessRemoteRead and its WRITE without AccessRemoteWrite.
func (d *Device) RegisterAccess(mem []byte, access Access) (*Region, error) {
	if access&^AccessRemote != 0 {
		return nil, fmt.Errorf("%w: access %#x", xfer.ErrInvalid, uint8(access))
	}
	if len(mem) == 0 {
		return nil, fmt.Errorf("%w: empty memory", ErrNotRegistered)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, ErrNoDevice
	}
	d.regions++
	d.mu.Unlock()
	base := uintptr(unsafe.Pointer(&mem[0]))
	reg := func(off, n uint64) (uint32, uint32, any, error) {
		var lkey, rkey C.uint32_t
		mr, err := C.tc_reg_mr(d.pd, C.uintptr_t(base+uintptr(off)), C.size_t(n),
			C.int(access&AccessRemoteRead), C.int(access&AccessRemoteWrite), &lkey, &rkey)
		if mr == nil {
			return 0, 0, 0, os.NewSyscallError("ibv_reg_mr", err)
		}
		return uint32(lkey), uint32(rkey), mr, nil
	}
	r, err := NewRegion(uint64(base), uint64(len(mem)), d.cfg.ChunkSize, access, d.cfg.RegisterWorkers, reg, deregMR)
	if err != nil {
		d.mu.Lock()
		d.regions--
		d.mu.Unlock()
		return nil, err
	}
	return r, nil
}

func deregMR(h any) error {
	mr, ok := h.(*C.struct_ibv_mr)
	if !ok {
		return fmt.Errorf("rdma: not a memory registration: %T", h)
	}
	if r, err := C.tc_dereg_mr(mr); r != 0 {
		return os.NewSyscallError("ibv_dereg_mr", err)
	}
	return nil
}

// Deregister releases a region's MRs. No transport may still use it.
func (d *Device) Deregister(r *Region) error {
	err := r.Release()
	d.mu.Lock()
	d.regions--
	d.mu.Unlock()
	return err
}

// NewTransport creates Config.QPs RC queue pairs, each on its own completion queue.
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
	// A completion queue per queue pair: whoever posts on a queue pair
	// reaps its completions, and nobody else's (see "Who reaps").
	cqe := min(depth+1, int(d.caps.max_cqe))
	rd := min(16, int(d.caps.max_qp_rd_atom), int(d.caps.max_qp_init_rd_atom))
	var qps []QueuePair
	var cqs []CompletionQueue
	undo := func() {
		for _, q := range qps {
			_ = q.Destroy()
		}
		for _, c := range cqs {
			_ = c.Destroy()
		}
	}
	for range cfg.QPs {
		cq, err := d.newCQ(cqe, cfg.PollBatch)
		if err != nil {
			undo()
			return fail(err)
		}
		cqs = append(cqs, cq)
		cqp, errno := C.tc_create_qp(d.pd, cq.q, C.int(depth))
		if cqp == nil {
			undo()
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
	return newTransport("rdma", cfg, d.log, d.addr, cqs, qps, release), nil
}

// newCQ creates a completion queue of cqe entries with its channel, and
// the eventfd its Wake writes.
func (d *Device) newCQ(cqe, batch int) (*verbsCQ, error) {
	ccq, errno := C.tc_create_cq(d.ctx, C.int(cqe), C.int(batch))
	if ccq == nil {
		return nil, os.NewSyscallError("ibv_create_cq", errno)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		C.tc_destroy_cq(ccq)
		return nil, os.NewSyscallError("eventfd", err)
	}
	cq := &verbsCQ{q: ccq, efd: efd}
	cq.fds = []unix.PollFd{{Fd: int32(C.tc_cq_fd(ccq)), Events: unix.POLLIN}, {Fd: int32(efd), Events: unix.POLLIN}}
	return cq, nil
}

// Close releases the protection domain and the device. It fails while
// regions or transports made from it are live.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	if d.regions > 0 || d.transports > 0 {
		return fmt.Errorf("rdma: device %s busy: %d regions, %d transports", d.name, d.regions, d.transports)
	}
	d.closed = true
	var errs []error
	if r, err := C.tc_dealloc_pd(d.pd); r != 0 {
		errs = append(errs, os.NewSyscallError("ibv_dealloc_pd", err))
	}
	if r, err := C.tc_close_device(d.ctx); r != 0 {
		errs = append(errs, os.NewSyscallError("ibv_close_device", err))
	}
	return errors.Join(errs...)
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
// non-blocking, waited on with poll(2) together with an eventfd that Wake
// writes and a Wait that sees it reads back.
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

func (c *verbsCQ) Wait(channel bool) (bool, error) {
	fds := c.fds
	if !channel {
		fds = c.fds[1:] // the eventfd alone
	}
	for {
		c.fds[0].Revents, c.fds[1].Revents = 0, 0
		_, err := unix.Poll(fds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, os.NewSyscallError("poll", err)
		}
		if c.fds[1].Revents != 0 {
			var b [8]byte
			_, _ = unix.Read(c.efd, b[:]) // EAGAIN: another Wait took it
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

func (c *verbsCQ) Channel() int { return int(c.fds[0].Fd) }

// maxTake bounds one TakeEvents: an event per arm, and the reaper arms
// once per sleep, so more than a few are never pending.
const maxTake = 64

func (c *verbsCQ) TakeEvents() (int, error) {
	n := 0
	for n < maxTake {
		r, err := C.tc_take_event(c.q)
		if r < 0 {
			return n, os.NewSyscallError("ibv_get_cq_event", err)
		}
		if r == 0 {
			break
		}
		n++
	}
	return n, nil
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
