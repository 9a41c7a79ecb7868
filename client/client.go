// Package client is the Go client of tensorcastd's control protocol. A
// Client is one connection; Dial says hello and maps the daemon's DRAM pool,
// so callers write into pool blocks in place. Each call of the protocol is a
// method (calls.go, peers.go, store.go, rdma.go, directory.go); OpenQueue
// opens a Queue, the shared rings of package queue, with the store's hot
// calls on it (store_queue.go). It imports no server package.
package client

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// DefaultSocket is where tensorcastd listens unless configured otherwise.
const DefaultSocket = "/run/tensorcast/tensorcastd.sock"

// Options configure Dial. Zero values take the defaults named per field.
type Options struct {
	Name        string        // client name sent with Hello (default: the program name)
	NoPool      bool          // do not map the pool at Dial (admin tools)
	DialTimeout time.Duration // bounds connecting, Hello and mapping the pool (also on a reconnect); default 5s
	// CallTimeout bounds each call's socket I/O (default: none). A call
	// the daemon may hold by design (Wait, Transfer, PollNotifications) is
	// given that long on top of what it may be held: its timeout, else the
	// call's deadline (WithDeadline). Without either, the daemon's own
	// default wait bounds it, which the client does not know, so the
	// socket then has no deadline for that call.
	CallTimeout time.Duration
	MaxFrame    int    // largest response frame accepted (default 1 MiB)
	Lane        string // default lane of every call's context
	// PolicyVersion is the default policy version of every call's context.
	PolicyVersion uint32
	// Reconnect makes a call that finds the connection broken (the daemon
	// restarted, was upgraded or crashed) dial the daemon again first, say
	// Hello, and go on on the new connection. The call that found the
	// connection breaking has failed and is not retried (it may have been
	// applied). The pool mapping is kept: a restart that kept L1 keeps the
	// pool, so PoolBytes and every offset into it stay valid; a daemon
	// with another pool fails the reconnect (ErrClosed: Dial again).
	// Everything the old connection held is gone: pins, reservations,
	// batches, registered buffers and queues (their calls fail).
	Reconnect bool
}

// CallOption sets a field of one call's context.
type CallOption func(*wire.Context)

// WithIdempotencyKey makes a mutating call idempotent: a retry with the same
// key on the same connection returns the first result. The daemon binds
// the key to the lane and arguments of its first use, on every
// connection of the same tenant (keys are per tenant: another tenant's
// use of the same key is its own): the key under another lane or with
// other arguments fails
// ErrFailedPrecondition, and so does the same call on another connection
// while the first lives (it runs afresh there once the first closed).
// The daemon remembers a connection's last Hello.Limits.MaxIdempotencyKeys
// keys, whatever other clients send; an older key is forgotten (counted
// in Stats as the connection's idempotency_keys_forgotten), and its retry
// runs again.
// OpenQueue is not idempotent by key (its answer carries a new fd).
func WithIdempotencyKey(key string) CallOption {
	return func(c *wire.Context) { c.IdempotencyKey = []byte(key) }
}

// WithLane sets the call's lane.
func WithLane(lane string) CallOption { return func(c *wire.Context) { c.Lane = []byte(lane) } }

// WithReplicas makes a store put or commit keep n copies of each value
// across the daemons of the cluster (this one's included; 1..8) instead
// of the daemon's store_replicas: with durable, each result comes once
// every copy is on its holder's L2.
func WithReplicas(n int) CallOption {
	return func(c *wire.Context) { c.Replicas = uint8(min(max(n, 0), 255)) }
}

// WithPolicyVersion sets the call's policy version; the daemon records it in
// the audit record of every mutating call.
func WithPolicyVersion(v uint32) CallOption {
	return func(c *wire.Context) { c.PolicyVersion = v }
}

// WithDeadline sets the call's deadline, relative to now: a Wait or
// Transfer without a timeout of its own waits that long.
func WithDeadline(d time.Duration) CallOption {
	return func(c *wire.Context) { c.DeadlineMS = millis(d) }
}

// Hello is what the daemon said at Dial.
type Hello struct {
	DaemonID        string
	Version         string
	ProtocolVersion uint32
	Limits          wire.LimitsInfo
	// PeerAddr is where the daemon's peer plane listens; empty without one.
	PeerAddr string
}

// PoolInfo describes the daemon's pool as mapped in this process.
type PoolInfo struct {
	Segment      xfer.SegmentID
	Size         uint64
	BlockClasses []uint64
}

// Buffer is a client buffer registered with the daemon: a sealed memfd
// mapped here and in the daemon.
type Buffer struct {
	ID  xfer.SegmentID
	Mem []byte
	// Huge is how many bytes of Mem are on transparent 2 MiB pages: its
	// whole 2 MiB spans, unless the kernel had none to give (before Linux
	// 6.1's MADV_COLLAPSE, shmem_enabled = deny, or memory too
	// fragmented).
	Huge uint64
}

// TaskStatus is one task's state.
type TaskStatus struct {
	State       xfer.State
	Transferred uint64
	Err         error // nil unless the task ended in failure
}

// Summary counts a batch's tasks by state.
type Summary = wire.Summary

// Counter is a named statistic.
type Counter = wire.Counter

// Stats is the daemon's counters.
type Stats struct {
	Pool        []Counter
	Engine      []Counter
	Connection  []Counter // this connection's holdings
	Transports  []Counter // transports' features and counters
	Store       []Counter // the KV block store's figures; none without a store
	Connections int
}

// Client is one connection to tensorcastd. Its methods are safe for
// concurrent use; calls are serialized on the connection.
type Client struct {
	socket  string
	opts    Options
	hello   Hello
	pool    PoolInfo
	poolMem []byte
	poolID  [2]uint64 // the pool memfd's device and inode

	lane []byte // opts.Lane, made once

	// mu serializes calls and guards every field below.
	mu   sync.Mutex
	uc   *net.UnixConn
	b    *flatbuffers.Builder
	req  wire.Request
	resp wire.Response
	// hold is how long the daemon may hold the answer to c.req by design
	// (a Wait's timeout), or unbounded; see Options.CallTimeout.
	hold time.Duration
	// dialing is the deadline of a Dial or redial in progress: its Hello
	// and pool mapping are bounded by DialTimeout, not CallTimeout (zero
	// otherwise).
	dialing time.Time
	rbuf    []byte
	hdr     [wire.FrameHeader]byte
	oob     []byte
	// fd2 is a second fd that came with the last answer read for a
	// caller collecting one (a queue's eventfd doorbell after its memfd),
	// noFD when none; the next such read closes one left unclaimed.
	fd2     int
	nextID  uint64
	broken  error
	closed  bool
	buffers map[xfer.SegmentID][]byte // mappings of buffers this client created
	queues  map[*Queue]struct{}       // queues open, released at Close

	stg staging // PutBytes and GetBytes copy through it (store.go)
}

// unbounded is a hold the client cannot bound: the daemon's default.
const unbounded time.Duration = -1

// Dial connects to the daemon at socket, says hello and, unless
// opts.NoPool, maps the pool.
func Dial(socket string, opts Options) (*Client, error) {
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.MaxFrame <= 0 {
		opts.MaxFrame = wire.DefaultMaxFrame
	}
	if opts.Name == "" && len(os.Args) > 0 {
		opts.Name = os.Args[0]
	}
	dialing := time.Now().Add(opts.DialTimeout)
	d := net.Dialer{Deadline: dialing}
	nc, err := d.Dial("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("tensorcast: cannot connect to the daemon at %s: %w", socket, err)
	}
	c := &Client{
		socket:  socket,
		opts:    opts,
		lane:    []byte(opts.Lane),
		uc:      nc.(*net.UnixConn),
		b:       flatbuffers.NewBuilder(1024),
		oob:     make([]byte, unix.CmsgSpace(4*4)),
		fd2:     noFD,
		buffers: make(map[xfer.SegmentID][]byte),
		queues:  make(map[*Queue]struct{}),
		dialing: dialing,
	}
	defer c.dialed()
	if err := c.sayHello(); err != nil {
		c.uc.Close()
		return nil, err
	}
	if !opts.NoPool {
		if err := c.mapPool(); err != nil {
			c.uc.Close()
			return nil, err
		}
	}
	return c, nil
}

// dialed ends a Dial or redial: calls are bounded by CallTimeout again
// (roundTrip sets a deadline only when there is one).
func (c *Client) dialed() {
	c.dialing = time.Time{}
	c.uc.SetDeadline(time.Time{})
}

func (c *Client) sayHello() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.helloLocked()
	c.hello = h
	return err
}

func (c *Client) helloLocked() (Hello, error) {
	m := wire.SetRequest[wire.HelloRequest](c.start(nil))
	m.ProtocolVersion, m.ClientName = wire.ProtocolVersion, []byte(c.opts.Name)
	r, err := call[wire.HelloResponse](c, noFD, nil)
	if err != nil {
		return Hello{}, err
	}
	return Hello{DaemonID: string(r.DaemonID), Version: string(r.Version),
		ProtocolVersion: r.ProtocolVersion, Limits: r.Limits, PeerAddr: string(r.PeerAddr)}, nil
}

func (c *Client) mapPool() error {
	if !sharedMemory {
		return fmt.Errorf("%w: mapping the pool needs Linux (dial with NoPool)", ErrNotSupported)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, fd, id, err := c.poolInfoLocked()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	c.poolID = id
	mem, err := shm.MapShared(fd, r.Size)
	if err != nil {
		return fmt.Errorf("tensorcast: mapping the pool: %w", err)
	}
	c.poolMem = mem
	c.pool = PoolInfo{Segment: xfer.SegmentID(r.Segment), Size: r.Size, BlockClasses: append([]uint64(nil), r.BlockClasses...)}
	return nil
}

// poolInfoLocked asks for the pool: its description, its memfd (the
// caller closes it) and the memfd's identity.
func (c *Client) poolInfoLocked() (*wire.PoolInfoResponse, int, [2]uint64, error) {
	wire.SetRequest[wire.PoolInfoRequest](c.start(nil))
	fd := noFD
	r, err := call[wire.PoolInfoResponse](c, noFD, &fd)
	if err != nil {
		closeFD(fd) // a refused answer that came with one anyway
		return nil, noFD, [2]uint64{}, err
	}
	if fd < 0 {
		return nil, noFD, [2]uint64{}, c.fail(fmt.Errorf("%w: PoolInfo came without the pool's fd", ErrProtocol))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, noFD, [2]uint64{}, fmt.Errorf("tensorcast: the pool's fd: %w", err)
	}
	return r, fd, [2]uint64{uint64(st.Dev), st.Ino}, nil
}

// redial replaces a broken connection (Options.Reconnect): a new one, its
// Hello, and a check that the daemon's pool is the one mapped. The call in
// progress (c.req) is kept for the caller to send. c.mu is held.
func (c *Client) redial() error {
	saved := c.req
	defer func() { c.req = saved }()
	c.dialing = time.Now().Add(c.opts.DialTimeout)
	defer c.dialed()
	nc, err := (&net.Dialer{Deadline: c.dialing}).Dial("unix", c.socket)
	if err != nil {
		return err
	}
	c.uc.Close()
	c.uc, c.broken = nc.(*net.UnixConn), nil
	// Hello() stays what the daemon said at Dial.
	if _, err := c.helloLocked(); err != nil {
		return c.fail(err)
	}
	if c.poolMem == nil {
		return nil
	}
	r, fd, id, err := c.poolInfoLocked()
	if err != nil {
		return c.fail(err)
	}
	unix.Close(fd)
	if id != c.poolID || r.Size != c.pool.Size {
		return c.fail(fmt.Errorf("%w: the daemon at %s restarted with another pool; dial again", ErrClosed, c.socket))
	}
	return nil
}

// Hello returns what the daemon said at Dial.
func (c *Client) Hello() Hello { return c.hello }

// Socket is the path the client dialed.
func (c *Client) Socket() string { return c.socket }

// Pool returns the pool's description; ok is false when it is not mapped.
func (c *Client) Pool() (PoolInfo, bool) { return c.pool, c.poolMem != nil }

// PoolBytes is the pool mapped in this process; blocks from AllocBlocks are
// PoolBytes()[off : off+size]. It is nil when the pool is not mapped and
// invalid after Close.
func (c *Client) PoolBytes() []byte { return c.poolMem }

// Close closes the connection (the daemon then releases everything it
// holds) and unmaps the pool and every buffer this client created.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	if err := c.uc.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		errs = append(errs, err)
	}
	c.broken = ErrClosed
	for q := range c.queues {
		errs = append(errs, q.release())
		delete(c.queues, q)
	}
	for id, mem := range c.buffers {
		errs = append(errs, shm.Unmap(mem))
		delete(c.buffers, id)
	}
	if c.poolMem != nil {
		errs = append(errs, shm.Unmap(c.poolMem))
		c.poolMem = nil
	}
	return errors.Join(errs...)
}

// start prepares c.req for a call with the default context and opts, and
// returns it for its body to be set (wire.SetRequest).
func (c *Client) start(opts []CallOption) *wire.Request {
	c.nextID++
	c.req.Ctx = wire.Context{RequestID: c.nextID, Lane: c.lane, PolicyVersion: c.opts.PolicyVersion}
	for _, o := range opts {
		o(&c.req.Ctx)
	}
	c.hold = 0
	return &c.req
}

// holdFor says the daemon may hold the current call for timeout or, when
// it is 0, until the call's deadline; without either, for as long as its
// own default, which the client does not know.
func (c *Client) holdFor(timeout time.Duration) {
	switch {
	case timeout > 0:
		c.hold = timeout + wire.TimeoutGrace
	case c.req.Ctx.DeadlineMS > 0:
		c.hold = time.Duration(c.req.Ctx.DeadlineMS)*time.Millisecond + wire.TimeoutGrace
	default:
		c.hold = unbounded
	}
}

// fail marks the connection broken: after a protocol or I/O error its state
// is unknown, so it is closed and every later call fails.
func (c *Client) fail(err error) error {
	if c.broken == nil {
		c.broken = fmt.Errorf("%w: %w", ErrClosed, err)
		c.uc.Close()
	}
	return err
}

// noFD is "no file descriptor" for call.
const noFD = -1

// closeFD closes fd unless it is noFD.
func closeFD(fd int) {
	if fd != noFD {
		unix.Close(fd)
	}
}

// call sends c.req (with sendFD when it is not noFD) and returns the
// answer's body, a *T. With recvFD it also collects one fd passed with the
// answer. A non-OK status is returned as a *StatusError; an answer to
// another request or with another body breaks the connection.
func call[T any, P interface {
	*T
	wire.ResponseBody
}](c *Client, sendFD int, recvFD *int) (P, error) {
	if err := c.roundTrip(sendFD, recvFD); err != nil {
		return nil, err
	}
	p, ok := c.resp.Body.(P)
	if !ok {
		return nil, c.fail(fmt.Errorf("%w: %s answered with %s", ErrProtocol, c.req.Kind(), c.resp.Kind()))
	}
	return p, nil
}

// roundTrip sends c.req and reads the answer into c.resp; it fails unless
// the answer is OK and for this request.
func (c *Client) roundTrip(sendFD int, recvFD *int) error {
	if c.broken != nil && (!c.opts.Reconnect || c.closed || c.redial() != nil) {
		return c.broken
	}
	frame := wire.EncodeRequest(c.b, &c.req)
	switch {
	case !c.dialing.IsZero():
		c.uc.SetDeadline(c.dialing)
	case c.opts.CallTimeout > 0:
		var d time.Time // no deadline: the daemon's own default bounds the call
		if c.hold != unbounded {
			d = time.Now().Add(c.opts.CallTimeout + c.hold)
		}
		c.uc.SetDeadline(d)
	}
	var err error
	if sendFD != noFD {
		var n int
		n, _, err = c.uc.WriteMsgUnix(frame, unix.UnixRights(sendFD), nil)
		if err == nil && n < len(frame) {
			_, err = c.uc.Write(frame[n:])
		}
	} else {
		_, err = c.uc.Write(frame)
	}
	if err != nil {
		// The daemon may have refused the connection (a disallowed peer)
		// and closed it before this frame went out: its refusal is already
		// waiting to be read and says more than EPIPE.
		c.uc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if rerr := c.readResponse(nil); rerr == nil && c.resp.RequestID == 0 && c.resp.Status != tcproto.CodeOK {
			return c.fail(statusErr(&c.resp))
		}
		return c.fail(fmt.Errorf("tensorcast: sending to %s: %w", c.socket, err))
	}
	if err := c.readResponse(recvFD); err != nil {
		return c.fail(err)
	}
	r := &c.resp
	if r.RequestID != 0 && r.RequestID != c.req.Ctx.RequestID {
		return c.fail(fmt.Errorf("%w: answer to request %d, sent %d", ErrProtocol, r.RequestID, c.req.Ctx.RequestID))
	}
	if r.RequestID == 0 && r.Status == tcproto.CodeOK {
		// Request id 0 answers no request: the daemon sends it only with a
		// refusal (a connection refused, a frame it could not read).
		return c.fail(fmt.Errorf("%w: an OK answer to request 0, sent %d", ErrProtocol, c.req.Ctx.RequestID))
	}
	if r.Status != tcproto.CodeOK {
		err := statusErr(r)
		if r.RequestID == 0 || !knownCode(r.Status) {
			// Not an answer to this request: a refusal of the connection
			// or of a bad frame; the daemon closes the connection. A
			// status the protocol does not name breaks it too.
			return c.fail(err)
		}
		return err
	}
	return nil
}

// statusErr is the error of r's non-OK status: a *StatusError, or
// ErrProtocol for a status the protocol does not name.
func statusErr(r *wire.Response) error {
	if !knownCode(r.Status) {
		return fmt.Errorf("%w: status %d", ErrProtocol, r.Status)
	}
	return &StatusError{Code: r.Status, Message: string(r.Message)}
}

func (c *Client) readResponse(recvFD *int) error {
	hdr := c.hdr[:]
	var n int
	var err error
	if recvFD != nil {
		closeFD(c.fd2)
		c.fd2 = noFD
		var oobn int
		n, oobn, _, _, err = c.uc.ReadMsgUnix(hdr, c.oob)
		if err == nil && oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(c.oob[:oobn])
			if perr != nil {
				return fmt.Errorf("%w: bad control message: %v", ErrProtocol, perr)
			}
			for i := range msgs {
				fds, _ := unix.ParseUnixRights(&msgs[i])
				for _, fd := range fds {
					switch {
					case *recvFD < 0:
						*recvFD = fd
					case c.fd2 == noFD:
						c.fd2 = fd
					default:
						unix.Close(fd)
					}
				}
			}
		}
	} else {
		n, err = c.uc.Read(hdr)
	}
	if err == nil && n < len(hdr) {
		_, err = io.ReadFull(c.uc, hdr[n:])
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: the daemon at %s closed the connection", ErrClosed, c.socket)
		}
		return fmt.Errorf("tensorcast: reading from %s: %w", c.socket, err)
	}
	size := int(binary.LittleEndian.Uint32(hdr))
	if size > c.opts.MaxFrame {
		return fmt.Errorf("%w: %d-byte answer (max %d)", ErrProtocol, size, c.opts.MaxFrame)
	}
	if cap(c.rbuf) < size {
		c.rbuf = make([]byte, size)
	}
	c.rbuf = c.rbuf[:size]
	if _, err := io.ReadFull(c.uc, c.rbuf); err != nil {
		return fmt.Errorf("tensorcast: reading from %s: %w", c.socket, err)
	}
	if err := wire.DecodeResponse(c.rbuf, wire.DecodeLimits{}, &c.resp); err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return nil
}
