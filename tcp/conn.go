package tcp

// A peer connection on the event loop: its state, the gnet handlers of
// both roles, reading frames and their payloads (onTraffic), and routing
// each frame (handle).

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/crc32c"
	"github.com/tensorcast/tensorcast/xfer"
)

type role uint8

const (
	roleClient role = iota + 1 // we dialed it; it carries our requests
	roleServer                 // the peer dialed it; we serve its requests
)

type hsState uint8

const (
	hsAwaitHello hsState = iota
	hsAwaitAuth
	hsReady
)

// conn is one peer connection. Fields marked loop-only are touched only on
// the connection's event loop.
type conn struct {
	n       *Node
	g       gnet.Conn
	role    role
	created time.Time
	peer    *peer  // client: set before enrolling; server: set at authentication (loop-only until then)
	epoch   uint64 // the peer's epoch on this connection
	window  int64  // client: in-flight bytes the peer accepts on it
	// remote is the peer's address, taken when the connection opens: what
	// log lines name it by. gnet forgets the address when it closes the
	// connection, which a failed write does on the spot, in the middle of
	// handling a frame.
	remote string

	// loop-only:
	hs      hsState
	metaC   []byte // handshake transcript (server side)
	metaS   []byte
	rx      rxState
	scratch [hdrLen]byte
	iov     [2][]byte
	tok     tokCache
	// gone is set by OnClose. A write that fails closes the connection
	// before it returns, and gnet releases its buffers and descriptor: the
	// frame's handler finishes, but nothing more is read or written, and
	// onTraffic returns Close (for gnet, a connection closed already),
	// which keeps gnet from buffering into the released connection.
	gone bool

	dataReqs atomic.Uint64 // data requests served (server side)
	// rxEvents counts the event-loop wake-ups that brought bytes on a
	// client connection: the reaper's witness that the peer still answers.
	rxEvents atomic.Uint64

	// fd is the connection's socket, which gnet owns; the event loop reads
	// payloads from it straight into their destination (readDirect).
	fd int

	// The write side of a client connection (writer.go). wmu guards wq,
	// fdClosed and the use of wfd outside the writer; wlock is held by the
	// writer across each write.
	wmu      sync.Mutex
	wq       wlist // frames waiting for the writer, in order
	fdClosed bool  // set by stopWriter (OnClose): nothing more is written
	wfd      int   // the writer's duplicate of the socket; it closes it
	wkick    chan struct{}
	wlock    sync.Mutex

	// Guarded by peer.mu (client connections):
	reqs     map[uint64]*pending
	due      dueHeap[*pending]   // the requests in reqs, by when the reaper looks at them (reaper.go)
	timedOut map[uint64]struct{} // ids whose answer no longer matters
	inflight int64
	closed   bool
	dropping bool // the reaper asked it to close
	// The reaper's view of rxEvents: the count it last saw and since when
	// (unix ns) it has not changed.
	seenRx uint64
	quiet  int64

	// Guarded by Node.mu (server connections being authenticated): when
	// the handshake times out (unix ns) and the slot in Node.handshaking.
	hsDue int64
	dslot int32
}

// rxState is the payload being received (loop-only).
type rxState struct {
	left int    // payload bytes still to come
	dst  []byte // where they go; nil discards
	// server side, a WRITE being received
	seg    xfer.MemSegment
	id     uint64
	n      uint32
	status uint16
	// client side, a READ response being received
	p *pending
	// sum, when the READ asked for it and this payload is the whole task,
	// takes the crc32c of the bytes as they land (xfer.Sum); crc is it so far.
	sum *xfer.Sum
	crc uint32
}

// tokCache remembers the last token a connection verified, so a stream of
// requests under one token costs one MAC check.
type tokCache struct {
	raw    []byte
	access Access
	rights Rights
	expiry int64
}

func (c *conn) logger() []any {
	if c.peer != nil {
		return []any{"peer", c.peer.id, "remote", c.remote}
	}
	return []any{"remote", c.remote}
}

// drop logs why a connection is being dropped and tells gnet to close it.
// A connection with no peer yet (not authenticated) may be anyone on the
// network, who could open one after another to fill the log, so its drops
// go through the refusal log: the first of a kind at once, the rest counted
// (see refusalLog). An authenticated peer's drops are each logged.
func (c *conn) drop(err error) gnet.Action {
	if c.peer == nil {
		c.n.refusals.note(c.n.log, dropReason(err), time.Now(), append(c.logger(), "err", err.Error())...)
		return gnet.Close
	}
	c.n.log.Warn("dropping peer connection", append(c.logger(), "reason", err.Error())...)
	c.peer.errs.Add(1)
	return gnet.Close
}

// dropReason is the refusal log's fixed reason for dropping a connection
// that has not authenticated with err. (A wrong key is refused, not
// dropped: see onAuth.)
func dropReason(err error) string {
	switch {
	case errors.Is(err, ErrFrame):
		return "malformed frame before authentication"
	case errors.Is(err, ErrProtocol):
		return "protocol violation before authentication"
	default:
		return "connection failed before authentication"
	}
}

// srvHandler handles the connections peers dial to this node (enrolled
// by the accept goroutine, node.go).
type srvHandler struct {
	gnet.BuiltinEventEngine
	n *Node
}

func (h *srvHandler) OnOpen(g gnet.Conn) ([]byte, gnet.Action) {
	c := &conn{n: h.n, g: g, role: roleServer, created: time.Now(), fd: g.Fd(), remote: g.RemoteAddr().String()}
	c.hsDue = addSat(addSat(c.created.UnixNano(), int64(h.n.cfg.HandshakeTimeout)), 1)
	g.SetContext(c)
	h.n.mu.Lock()
	h.n.handshaking.push(c)
	h.n.mu.Unlock()
	return nil, gnet.None
}

func (h *srvHandler) OnTraffic(g gnet.Conn) gnet.Action {
	return g.Context().(*conn).onTraffic()
}

func (h *srvHandler) OnClose(g gnet.Conn, err error) gnet.Action {
	c, _ := g.Context().(*conn)
	if c == nil {
		return gnet.None
	}
	c.gone = true
	if c.rx.seg != nil {
		c.rx.seg.Release()
		c.rx.seg = nil
	}
	h.n.mu.Lock()
	h.n.handshaking.remove(c)
	h.n.mu.Unlock()
	if p := c.peer; p != nil {
		p.mu.Lock()
		delete(p.inbound, c)
		p.mu.Unlock()
		h.n.log.Debug("inbound peer connection closed", append(c.logger(), "err", err)...)
	}
	return gnet.None
}

// cliHandler handles the connections this node dialed.
type cliHandler struct {
	gnet.BuiltinEventEngine
	n *Node
}

func (h *cliHandler) OnTraffic(g gnet.Conn) gnet.Action {
	c := g.Context().(*conn)
	c.rxEvents.Add(1)
	return c.onTraffic()
}

func (h *cliHandler) OnClose(g gnet.Conn, err error) gnet.Action {
	c, _ := g.Context().(*conn)
	if c == nil {
		return gnet.None
	}
	c.gone = true
	// Nothing is written once the requests fail below (writer.go).
	c.stopWriter()
	p := c.peer
	p.mu.Lock()
	c.closed = true
	reqs := c.reqs
	c.reqs = nil
	c.due.reset()
	for _, pd := range reqs {
		p.inflight -= pd.credit()
	}
	c.inflight = 0
	for i, sc := range p.sess {
		if sc == c {
			p.sess = append(p.sess[:i], p.sess[i+1:]...)
			break
		}
	}
	p.wakeLocked()
	p.mu.Unlock()
	// No error: closed by this node (a stalled or overdue connection
	// dropped, logged with its reason where it was decided), not by the
	// network or the peer.
	why := "closed by this node"
	if err != nil {
		why = err.Error()
	}
	cause := fmt.Errorf("%w: peer %s: %s", ErrConnLost, p.id, why)
	if h.n.closed.Load() {
		cause = fmt.Errorf("%w: %w", xfer.ErrClosed, cause)
	}
	if len(reqs) > 0 && !h.n.closed.Load() {
		h.n.log.Warn("peer connection closed with requests in flight", "peer", p.id, "requests", len(reqs), "err", err)
	}
	for _, pd := range reqs {
		pd.finish(0, cause)
	}
	return gnet.None
}

// onTraffic decodes and handles every whole frame buffered on the
// connection, and moves payload bytes straight into their destination.
func (c *conn) onTraffic() gnet.Action {
	g := c.g
	for {
		if c.rx.left > 0 {
			var k int
			switch avail := g.InboundBuffered(); {
			case avail > 0 && c.rx.dst != nil:
				k, _ = g.Read(c.rx.dst[:min(avail, c.rx.left)])
				c.land(k)
			case avail > 0:
				k, _ = g.Discard(min(avail, c.rx.left))
			case c.rx.dst != nil:
				// What the event loop read is used up: the rest of the
				// payload goes from the socket straight to its
				// destination, without a copy through the loop's buffer.
				var err error
				if k, err = c.readDirect(); err != nil {
					return c.drop(err)
				}
			}
			if k <= 0 {
				return gnet.None
			}
			c.rx.left -= k
			if c.peer != nil {
				c.peer.bytesIn.Add(uint64(k))
			}
			if c.rx.left == 0 {
				if err := c.payloadDone(); err != nil {
					return c.drop(err)
				}
				if a, stop := c.handled(); stop {
					return a
				}
			}
			continue
		}
		if g.InboundBuffered() < hdrLen {
			return gnet.None
		}
		hb, err := g.Peek(hdrLen)
		if err != nil {
			return gnet.None
		}
		h, err := decodeHeader(hb, c.n.lim)
		if err != nil {
			return c.drop(err)
		}
		if c.role == roleServer && c.hs != hsReady {
			if err := c.handshakeFrame(&h); err != nil {
				return c.drop(err)
			}
		}
		need := hdrLen + int(h.metaLen)
		if g.InboundBuffered() < need {
			return gnet.None
		}
		buf, err := g.Next(need)
		if err != nil {
			return gnet.None
		}
		if err := c.handle(&h, buf[hdrLen:]); err != nil {
			if errors.Is(err, errRefused) {
				return gnet.Close
			}
			return c.drop(err)
		}
		if a, stop := c.handled(); stop {
			return a
		}
	}
}

// handled is what onTraffic does after a frame (or a payload) was handled:
// stop when the connection closed meanwhile, and drop a server connection
// whose peer lets the answers pile up (checkWindow).
func (c *conn) handled() (gnet.Action, bool) {
	if c.gone {
		return gnet.Close, true
	}
	if c.role == roleServer {
		if err := c.checkWindow(); err != nil {
			return c.drop(err), true
		}
	}
	return gnet.None, false
}

// readDirect reads the rest of the payload being received from the socket
// into its destination, in one read: a short one means the socket had no
// more for now, and the event loop calls again when it has (its poller is
// level-triggered). It returns 0 when nothing was there, and an error when
// the connection ended mid-frame. Called on the event loop only, so the fd
// is open.
func (c *conn) readDirect() (int, error) {
	for {
		k, err := unix.Read(c.fd, c.rx.dst[:c.rx.left])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, nil
		case err != nil:
			return 0, fmt.Errorf("%w: %d payload bytes still due: %w", ErrConnLost, c.rx.left, os.NewSyscallError("read", err))
		case k == 0:
			return 0, fmt.Errorf("%w: closed by the peer with %d payload bytes still due", ErrConnLost, c.rx.left)
		}
		c.land(k)
		return k, nil
	}
}

// land moves past k payload bytes just written at the front of c.rx.dst,
// taking their crc32c first when the READ asked for it: they are still in
// this CPU's cache, where a check after the transfer would read them back
// from memory.
func (c *conn) land(k int) {
	if c.rx.sum != nil {
		c.rx.crc = crc32c.Update(c.rx.crc, c.rx.dst[:k])
	}
	c.rx.dst = c.rx.dst[k:]
}

func (c *conn) handle(h *header, meta []byte) error {
	if c.role == roleClient {
		if h.typ == tRefuse {
			return c.onRefused(meta)
		}
		return c.handleResponse(h, meta)
	}
	switch c.hs {
	case hsAwaitHello:
		return c.onHello(meta) // a hello: see handshakeFrame
	case hsAwaitAuth:
		if h.typ == tRefuse {
			// The dialer refuses our hello (another cluster key, another
			// daemon than it dialed, a retired epoch).
			return c.onRefused(meta)
		}
		return c.onAuth(meta)
	}
	switch h.typ {
	case tRefuse:
		return c.onRefused(meta)
	case tOpenReq:
		return c.onOpen(h, meta)
	case tReadReq:
		return c.onRead(h, meta)
	case tWriteReq:
		return c.onWrite(h, meta)
	case tNotify:
		return c.onNotify(h, meta)
	case tExchReq:
		return c.onExchange(h, meta)
	}
	return fmt.Errorf("%w: unexpected frame %d from a client", ErrProtocol, h.typ)
}

// handshakeFrame checks that a frame on a server connection still in its
// handshake is one the handshake expects, as soon as its header is in and
// before its metadata is waited for: a frame the handshake never takes is
// not buffered, and an exchange frame, whose metadata may reach 64 KiB,
// would make an unauthenticated connection hold eight times the 8 KiB
// that the handshake's frames are bounded by.
func (c *conn) handshakeFrame(h *header) error {
	switch {
	case c.hs == hsAwaitHello && h.typ != tHello:
		return fmt.Errorf("%w: frame %d before hello", ErrProtocol, h.typ)
	case c.hs == hsAwaitAuth && h.typ != tAuth && h.typ != tRefuse:
		return fmt.Errorf("%w: frame %d before auth", ErrProtocol, h.typ)
	case h.metaLen > c.n.lim.maxMeta:
		return fmt.Errorf("%w: metadata of %d bytes exceeds %d", ErrFrame, h.metaLen, c.n.lim.maxMeta)
	}
	return nil
}

// onRefused logs the peer's refusal and ends the connection. The peer of
// a connection that has not authenticated may be anyone on the network,
// so its refusals go through the refusal log, as its drops do (see drop);
// an authenticated peer's are each logged. The peer's reason is cut to
// maxRefuseReason bytes.
func (c *conn) onRefused(meta []byte) error {
	if c.peer == nil {
		c.n.refusals.note(c.n.log, "peer refused us before authenticating", time.Now(),
			append(c.logger(), "said", refuseReason(meta))...)
		return errRefused
	}
	c.n.log.Warn("peer refused us", append(c.logger(), "reason", refuseReason(meta))...)
	return errRefused
}

// writeFrame writes a header and metadata on the loop.
func (c *conn) writeFrame(h *header, meta []byte) {
	putHeader(c.scratch[:], h)
	c.iov[0], c.iov[1] = c.scratch[:], meta
	_, _ = c.g.Writev(c.iov[:])
	c.iov[0], c.iov[1] = nil, nil
}
