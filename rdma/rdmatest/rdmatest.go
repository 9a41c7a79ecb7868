// Package rdmatest is an in-memory RDMA fabric for tests of the code above
// package rdma: devices that register memory of this process, and real
// rdma.Transports between them over queue pairs that move the bytes with
// copy. It needs no device, no libibverbs and no cgo.
//
// The fabric enforces what a device enforces, so that a test can check an
// owner's refusals without hardware: a key works only while its region is
// registered, only inside that region, and only on the device that
// registered it (a local key on the poster's, a remote key on the peer's);
// a remote key grants only the access its region was registered with. A
// work request that breaks any of that completes with
// IBV_WC_LOC_PROT_ERR or IBV_WC_REM_ACCESS_ERR and takes its queue pair to
// the error state, where what follows flushes (IBV_WC_WR_FLUSH_ERR), until
// the transport reconnects it. A queue pair connected to a GID no device of
// the fabric has reaches nothing: its work completes with
// IBV_WC_RETRY_EXC_ERR, as on hardware once the retries run out.
//
// Test controls: Device.Hold keeps posted work from executing until
// Device.Release (work in flight); Device.FailQueuePairs moves every queue
// pair to the error state, as a fatal device error would; Device.Stats
// counts posts, work requests, signalled completions and connects;
// Device.Live counts the regions and transports not yet released;
// Device.OnRegister, Device.OnDeregister and Device.OnNewTransport run a
// test's function at each registration, deregistration and transport
// made, with no lock held, so that a test can make one take as long as it
// may on a device (an ibv_reg_mr of GiBs takes seconds under Soft-RoCE;
// creating queue pairs and completion queues takes device calls too) and
// count what was released.
//
// Memory handed to Register must stay alive and in place while it is
// registered (a buffer the test holds, or an mmap'd segment).
package rdmatest

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/xfer"
)

// Fabric is a set of devices that reach each other.
type Fabric struct {
	// mu guards everything below and every device's, queue pair's and
	// completion queue's state: the fabric is a test double, one lock is
	// enough.
	mu      sync.Mutex
	devs    map[rdma.GID]*Device
	mrs     map[uint32]*mr // by key: a region's lkey and rkey are the same number
	nextKey uint32
	nextQPN uint32
	ndevs   int
}

// mr is one registered chunk.
type mr struct {
	dev    *Device
	mem    []byte
	base   uint64 // address of mem[0]
	access rdma.Access
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric {
	return &Fabric{devs: map[rdma.GID]*Device{}, mrs: map[uint32]*mr{}, nextKey: 0x100, nextQPN: 0x10}
}

// Stats counts what a device's queue pairs were given.
type Stats struct {
	Posts    int // Post calls
	Posted   int // work requests posted
	Signaled int // signalled work requests executed
	Connects int // queue pairs connected (RTS)
	// BlindWaits counts waits on a completion queue that left its
	// channel alone (a reactor worker polls it).
	BlindWaits int
}

// Device is one port on the fabric, with a RoCE v2 GID of its own
// (::ffff:10.99.0.N). It has the methods of *rdma.Device.
type Device struct {
	f    *Fabric
	name string
	cfg  rdma.Config
	addr rdma.Addr
	log  *slog.Logger

	// Guarded by f.mu.
	regions, transports int
	closed              bool
	hold                bool
	qps                 map[*queuePair]struct{}
	stats               Stats
	onRegister          func(mem []byte, access rdma.Access)
	onDeregister        func(r *rdma.Region)
	onNewTransport      func()
}

// Open adds a device named name. cfg tunes the transports it makes (its
// zero fields take rdma's defaults); Device and GID are ignored.
func (f *Fabric) Open(name string, cfg rdma.Config, log *slog.Logger) *Device {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := rdma.DefaultConfig()
	if cfg.QPs == 0 {
		cfg.QPs = d.QPs
	}
	if cfg.SendDepth == 0 {
		cfg.SendDepth = d.SendDepth
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = d.ChunkSize
	}
	if cfg.Port == 0 {
		cfg.Port = 1
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ndevs++
	gid := rdma.GID{10: 0xff, 11: 0xff, 12: 10, 13: 99, 14: byte(f.ndevs >> 8), 15: byte(f.ndevs)}
	dev := &Device{f: f, name: name, cfg: cfg, log: log, qps: map[*queuePair]struct{}{},
		addr: rdma.Addr{GID: gid, GIDIndex: 1, MTU: rdma.MTU4096}}
	f.devs[gid] = dev
	return dev
}

// Name is the device's name.
func (d *Device) Name() string { return d.name }

// Port is the device's port (Config.Port, default 1).
func (d *Device) Port() int { return d.cfg.Port }

// Addr is the device's address on the fabric.
func (d *Device) Addr() rdma.Addr { return d.addr }

// Register is RegisterAccess with rdma.AccessRemote.
func (d *Device) Register(mem []byte) (*rdma.Region, error) {
	return d.RegisterAccess(mem, rdma.AccessRemote)
}

// RegisterAccess registers mem, one key per Config.ChunkSize, granting the
// peer access.
func (d *Device) RegisterAccess(mem []byte, access rdma.Access) (*rdma.Region, error) {
	if access&^rdma.AccessRemote != 0 {
		return nil, fmt.Errorf("%w: access %#x", xfer.ErrInvalid, uint8(access))
	}
	if len(mem) == 0 {
		return nil, fmt.Errorf("%w: empty memory", rdma.ErrNotRegistered)
	}
	f := d.f
	f.mu.Lock()
	if d.closed {
		f.mu.Unlock()
		return nil, rdma.ErrNoDevice
	}
	d.regions++
	hook := d.onRegister
	f.mu.Unlock()
	if hook != nil {
		hook(mem, access)
	}
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	reg := func(off, n uint64) (uint32, uint32, any, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.nextKey++
		k := f.nextKey
		f.mrs[k] = &mr{dev: d, mem: mem[off : off+n], base: base + off, access: access}
		return k, k, k, nil
	}
	r, err := rdma.NewRegion(base, uint64(len(mem)), d.cfg.ChunkSize, access, 1, reg, f.deregister)
	if err != nil {
		f.mu.Lock()
		d.regions--
		f.mu.Unlock()
		return nil, err
	}
	return r, nil
}

func (f *Fabric) deregister(h any) error {
	k, ok := h.(uint32)
	if !ok {
		return fmt.Errorf("rdmatest: not a registration: %T", h)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mrs[k] == nil {
		return fmt.Errorf("rdmatest: key %#x deregistered twice", k)
	}
	delete(f.mrs, k)
	return nil
}

// Deregister releases a region's keys: work naming them fails from now on.
func (d *Device) Deregister(r *rdma.Region) error {
	d.f.mu.Lock()
	hook := d.onDeregister
	d.f.mu.Unlock()
	if hook != nil {
		hook(r)
	}
	err := r.Release()
	d.f.mu.Lock()
	d.regions--
	d.f.mu.Unlock()
	return err
}

// NewTransport makes Config.QPs queue pairs, each on its own completion
// queue, as rdma.Device.NewTransport does.
func (d *Device) NewTransport() (*rdma.Transport, error) {
	f := d.f
	f.mu.Lock()
	hook := d.onNewTransport
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	f.mu.Lock()
	if d.closed {
		f.mu.Unlock()
		return nil, rdma.ErrNoDevice
	}
	d.transports++
	qps := make([]rdma.QueuePair, d.cfg.QPs)
	cqs := make([]rdma.CompletionQueue, d.cfg.QPs)
	destroy := func() {
		for _, c := range cqs {
			if c != nil {
				_ = c.Destroy()
			}
		}
	}
	for i := range qps {
		cq, err := newCompletionQueue(f, d)
		if err != nil {
			for _, q := range qps[:i] {
				delete(d.qps, q.(*queuePair))
			}
			d.transports--
			f.mu.Unlock()
			destroy()
			return nil, err
		}
		f.nextQPN++
		q := &queuePair{d: d, cq: cq, num: f.nextQPN, buf: make([]rdma.WorkRequest, d.cfg.SendDepth)}
		d.qps[q] = struct{}{}
		qps[i], cqs[i] = q, cq
	}
	f.mu.Unlock()
	release := func() {
		f.mu.Lock()
		d.transports--
		f.mu.Unlock()
	}
	t, err := rdma.NewTransport(d.cfg, d.log, d.addr, cqs, qps, release)
	if err != nil {
		f.mu.Lock()
		for _, q := range qps {
			delete(d.qps, q.(*queuePair))
		}
		f.mu.Unlock()
		destroy()
		release()
		return nil, err
	}
	return t, nil
}

// Close takes the device off the fabric. It fails while regions or
// transports made from it are live.
func (d *Device) Close() error {
	f := d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if d.closed {
		return nil
	}
	if d.regions > 0 || d.transports > 0 {
		return fmt.Errorf("rdmatest: device %s busy: %d regions, %d transports", d.name, d.regions, d.transports)
	}
	d.closed = true
	delete(f.devs, d.addr.GID)
	return nil
}

// Live is how many regions and transports made from the device are not
// released yet.
func (d *Device) Live() (regions, transports int) {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	return d.regions, d.transports
}

// OnRegister has f run at the start of each RegisterAccess of the device,
// with the memory and access asked for, before any key is made and with
// no lock of the fabric held: f may block, as a large registration does
// on a device, while the fabric's other work goes on. nil: none.
func (d *Device) OnRegister(f func(mem []byte, access rdma.Access)) {
	d.f.mu.Lock()
	d.onRegister = f
	d.f.mu.Unlock()
}

// OnDeregister has f run at the start of each Deregister of the device,
// with the region being released, with no lock of the fabric held. nil:
// none.
func (d *Device) OnDeregister(f func(r *rdma.Region)) {
	d.f.mu.Lock()
	d.onDeregister = f
	d.f.mu.Unlock()
}

// OnNewTransport has f run at the start of each NewTransport of the
// device, before anything is made and with no lock of the fabric held:
// f may block. nil: none.
func (d *Device) OnNewTransport(f func()) {
	d.f.mu.Lock()
	d.onNewTransport = f
	d.f.mu.Unlock()
}

// Stats is what the device's queue pairs were given so far.
func (d *Device) Stats() Stats {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	return d.stats
}

// Hold keeps work posted on the device's queue pairs from executing: it
// stays in flight until Release or a queue pair error flushes it.
func (d *Device) Hold() {
	d.f.mu.Lock()
	d.hold = true
	d.f.mu.Unlock()
}

// Release executes the held work, in order, and stops holding.
func (d *Device) Release() {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	d.hold = false
	for q := range d.qps {
		held := q.held
		q.held = nil
		for i := range held {
			q.exec(&held[i])
		}
	}
}

// FailQueuePairs moves every queue pair of the device to the error state,
// as a fatal device error would: what they have in flight flushes, and
// their transports reconnect them.
func (d *Device) FailQueuePairs() {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	for q := range d.qps {
		q.failLocked()
	}
}

// queuePair implements rdma.QueuePair.
type queuePair struct {
	d   *Device
	cq  *completionQueue
	num uint32
	buf []rdma.WorkRequest // the posting buffer; read under f.mu by Post

	// Guarded by f.mu.
	peer      *Device // the device of the GID it is connected to; nil: none
	connected bool
	failed    bool               // in the error state: work flushes
	held      []rdma.WorkRequest // posted while the device holds
}

var errNotConnected = errors.New("rdmatest: post on a queue pair that is not connected")

func (q *queuePair) WorkRequests() []rdma.WorkRequest { return q.buf }

func (q *queuePair) Post(n int) (int, error) {
	f := q.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !q.connected {
		return 0, errNotConnected
	}
	q.d.stats.Posts++
	q.d.stats.Posted += n
	for i := range q.buf[:n] {
		w := &q.buf[i]
		switch {
		case q.failed:
			q.cq.push(rdma.NewWorkCompletion(w.ID(), rdma.WCWRFlushErr, 0))
		case q.d.hold:
			q.held = append(q.held, *w)
		default:
			q.exec(w)
		}
	}
	return n, nil
}

// exec performs one work request; f.mu is held.
func (q *queuePair) exec(w *rdma.WorkRequest) {
	if q.failed {
		q.cq.push(rdma.NewWorkCompletion(w.ID(), rdma.WCWRFlushErr, 0))
		return
	}
	if q.peer == nil {
		q.errorLocked(w, rdma.WCRetryExcErr)
		return
	}
	if n := w.Len(); n > 0 {
		laddr, lkey := w.Local()
		raddr, rkey := w.Remote()
		local := q.d.f.resolve(q.d, lkey, laddr, n, 0)
		if local == nil {
			q.errorLocked(w, rdma.WCLocProtErr)
			return
		}
		need := rdma.AccessRemoteRead
		if w.Write() {
			need = rdma.AccessRemoteWrite
		}
		remote := q.d.f.resolve(q.peer, rkey, raddr, n, need)
		if remote == nil {
			q.errorLocked(w, rdma.WCRemAccessErr)
			return
		}
		if w.Write() {
			copy(remote, local)
		} else {
			copy(local, remote)
		}
	}
	if w.Signaled() {
		q.d.stats.Signaled++
		q.cq.push(rdma.NewWorkCompletion(w.ID(), rdma.WCSuccess, w.Len()))
	}
}

// resolve is [addr, addr+n) of the chunk key names on dev, or nil when the
// key is not dev's, the range is outside its chunk or need is not granted;
// f.mu is held.
func (f *Fabric) resolve(dev *Device, key uint32, addr uint64, n uint32, need rdma.Access) []byte {
	m := f.mrs[key]
	if m == nil || m.dev != dev || m.access&need != need || addr < m.base {
		return nil
	}
	off := addr - m.base
	if off > uint64(len(m.mem)) || uint64(n) > uint64(len(m.mem))-off {
		return nil
	}
	return m.mem[off : off+uint64(n)]
}

// errorLocked completes w with st and moves q to the error state; f.mu is
// held.
func (q *queuePair) errorLocked(w *rdma.WorkRequest, st rdma.WCStatus) {
	q.cq.push(rdma.NewWorkCompletion(w.ID(), st, 0))
	q.failLocked()
}

// failLocked moves q to the error state, flushing what it holds; f.mu is
// held.
func (q *queuePair) failLocked() {
	q.failed = true
	for i := range q.held {
		q.cq.push(rdma.NewWorkCompletion(q.held[i].ID(), rdma.WCWRFlushErr, 0))
	}
	q.held = nil
}

func (q *queuePair) Connect(_, remote *rdma.ConnInfo) error {
	f := q.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	q.peer = f.devs[remote.GID]
	q.connected, q.failed = true, false
	q.d.stats.Connects++
	return nil
}

func (q *queuePair) Fail() error {
	q.d.f.mu.Lock()
	defer q.d.f.mu.Unlock()
	q.failLocked()
	return nil
}

func (q *queuePair) Reset() error {
	q.d.f.mu.Lock()
	defer q.d.f.mu.Unlock()
	q.held = nil
	q.connected, q.failed, q.peer = false, false, nil
	return nil
}

func (q *queuePair) QPN() uint32 { return q.num }

func (q *queuePair) Destroy() error {
	q.d.f.mu.Lock()
	defer q.d.f.mu.Unlock()
	delete(q.d.qps, q)
	return nil
}

// completionQueue implements rdma.CompletionQueue. Its channel is an
// eventfd, as a device's completion channel is a file: an armed completion
// writes it, TakeEvents reads it, so that a reactor worker polls it on its
// ring exactly as it polls a device's.
type completionQueue struct {
	f *Fabric
	d *Device // whose Stats count its waits
	// Guarded by f.mu.
	wcs   []rdma.WorkCompletion
	armed bool

	ch  int // the channel: an eventfd, counting events
	efd int // Wake writes it
	fds [2]unix.PollFd
}

func newCompletionQueue(f *Fabric, d *Device) (*completionQueue, error) {
	ch, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("eventfd", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ch)
		return nil, os.NewSyscallError("eventfd", err)
	}
	c := &completionQueue{f: f, d: d, ch: ch, efd: efd}
	c.fds = [2]unix.PollFd{{Fd: int32(ch), Events: unix.POLLIN}, {Fd: int32(efd), Events: unix.POLLIN}}
	return c, nil
}

// push adds a completion; f.mu is held.
func (c *completionQueue) push(wc rdma.WorkCompletion) {
	c.wcs = append(c.wcs, wc)
	if c.armed {
		c.armed = false
		efdWrite(c.ch)
	}
}

func (c *completionQueue) Poll(wcs []rdma.WorkCompletion) (int, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	n := copy(wcs, c.wcs)
	c.wcs = c.wcs[:copy(c.wcs, c.wcs[n:])]
	return n, nil
}

func (c *completionQueue) Arm() error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.armed = true
	return nil
}

func (c *completionQueue) Wait(channel bool) (bool, error) {
	fds := c.fds[:]
	if !channel {
		fds = c.fds[1:]
		c.f.mu.Lock()
		c.d.stats.BlindWaits++
		c.f.mu.Unlock()
	}
	for {
		c.fds[0].Revents, c.fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, -1); err == unix.EINTR {
			continue
		} else if err != nil {
			return false, os.NewSyscallError("poll", err)
		}
		if c.fds[1].Revents != 0 {
			_, _ = efdRead(c.efd)
			return false, nil
		}
		if c.fds[0].Revents != 0 {
			n, err := c.TakeEvents()
			if err != nil {
				return false, err
			}
			if n > 0 {
				return true, nil
			}
			// A worker took it first: wait again.
		}
	}
}

func (c *completionQueue) Channel() int { return c.ch }

func (c *completionQueue) TakeEvents() (int, error) {
	n, err := efdRead(c.ch)
	if err == unix.EAGAIN {
		return 0, nil
	} else if err != nil {
		return 0, os.NewSyscallError("read", err)
	}
	return int(n), nil
}

func (c *completionQueue) Wake() { efdWrite(c.efd) }

// efdRead and efdWrite read and add to an eventfd's count through the
// system call itself, with the 8 bytes on the stack: no allocation per
// completion.
func efdRead(fd int) (uint64, error) {
	var v uint64
	_, _, e := unix.Syscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&v)), 8)
	if e != 0 {
		return 0, e
	}
	return v, nil
}

func efdWrite(fd int) {
	v := uint64(1)
	unix.Syscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&v)), 8) //nolint:errcheck
}

func (c *completionQueue) Destroy() error {
	return errors.Join(unix.Close(c.ch), unix.Close(c.efd))
}
