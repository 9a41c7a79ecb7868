package tcp

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

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

	// loop-only:
	hs      hsState
	metaC   []byte // handshake transcript (server side)
	metaS   []byte
	rx      rxState
	scratch [hdrLen]byte
	iov     [2][]byte
	tok     tokCache

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
}

// tokCache remembers the last token a connection verified, so a stream of
// requests under one token costs one MAC check.
type tokCache struct {
	raw    []byte
	name   string
	rights Rights
	expiry int64
}

func (c *conn) logger() []any {
	if c.peer != nil {
		return []any{"peer", c.peer.id, "remote", c.g.RemoteAddr().String()}
	}
	return []any{"remote", c.g.RemoteAddr().String()}
}

// drop logs why a connection is being dropped and tells gnet to close it.
func (c *conn) drop(err error) gnet.Action {
	c.n.log.Warn("dropping peer connection", append(c.logger(), "reason", err.Error())...)
	if c.peer != nil {
		c.peer.errs.Add(1)
	}
	return gnet.Close
}

// srvHandler handles the connections peers dial to this node.
type srvHandler struct {
	gnet.BuiltinEventEngine
	n      *Node
	booted chan struct{}
}

func (h *srvHandler) OnBoot(eng gnet.Engine) gnet.Action {
	h.n.srvEng = eng
	close(h.booted)
	return gnet.None
}

func (h *srvHandler) OnOpen(g gnet.Conn) ([]byte, gnet.Action) {
	if !h.n.ready.Load() {
		return nil, gnet.Close
	}
	c := &conn{n: h.n, g: g, role: roleServer, created: time.Now(), fd: g.Fd()}
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
	// Nothing is written once the requests fail below (writer.go).
	c.stopWriter()
	p := c.peer
	p.mu.Lock()
	c.closed = true
	reqs := c.reqs
	c.reqs = nil
	c.due.reset()
	for _, pd := range reqs {
		if pd.isData() {
			p.inflight -= int64(pd.n)
		}
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
	cause := fmt.Errorf("%w: peer %s: %v", ErrConnLost, p.id, err)
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
				c.rx.dst = c.rx.dst[k:]
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
	}
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
		c.rx.dst = c.rx.dst[k:]
		return k, nil
	}
}

// errRefused: the handshake was refused and already logged.
var errRefused = errors.New("refused")

// Reasons a peer that proved the cluster key is refused (see the package
// doc).
const (
	reasonUnknownID = "daemon id not among this daemon's peers"
	reasonIDInUse   = "daemon id held by a live session of another epoch"
)

// liveLocked reports whether the peer's current session is live: outbound
// connections up, or inbound ones of its current epoch open. p.mu is held.
func (p *peer) liveLocked() bool {
	if len(p.sess) > 0 {
		return true
	}
	for c := range p.inbound {
		if c.epoch == p.epoch {
			return true
		}
	}
	return false
}

func (c *conn) handle(h *header, meta []byte) error {
	if h.typ == tRefuse {
		c.n.log.Warn("peer refused us", append(c.logger(), "reason", string(meta))...)
		return errRefused
	}
	if c.role == roleClient {
		return c.handleResponse(h, meta)
	}
	switch c.hs {
	case hsAwaitHello:
		if h.typ != tHello {
			return fmt.Errorf("%w: frame %d before hello", ErrProtocol, h.typ)
		}
		return c.onHello(meta)
	case hsAwaitAuth:
		if h.typ != tAuth {
			return fmt.Errorf("%w: frame %d before auth", ErrProtocol, h.typ)
		}
		return c.onAuth(meta)
	}
	switch h.typ {
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

// handshakeMAC binds both hellos (ids, epochs, addresses, blobs, nonces).
func handshakeMAC(key []byte, label string, metaC, metaS []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(label))
	var l [4]byte
	binary.LittleEndian.PutUint32(l[:], uint32(len(metaC)))
	m.Write(l[:])
	m.Write(metaC)
	m.Write(metaS)
	return m.Sum(nil)
}

const (
	labelServer = "tensorcast server"
	labelClient = "tensorcast client"
)

// refuse logs a refusal (rate-limited per reason, see refusalLog), tells
// the peer why and ends the connection. reason is a fixed string.
func (c *conn) refuse(reason string, kv ...any) error {
	c.n.refusals.note(c.n.log, reason, time.Now(), append(c.logger(), kv...)...)
	c.writeFrame(&header{typ: tRefuse, metaLen: uint16(len(reason))}, []byte(reason))
	return errRefused
}

// writeFrame writes a header and metadata on the loop.
func (c *conn) writeFrame(h *header, meta []byte) {
	putHeader(c.scratch[:], h)
	c.iov[0], c.iov[1] = c.scratch[:], meta
	_, _ = c.g.Writev(c.iov[:])
	c.iov[0], c.iov[1] = nil, nil
}

func (c *conn) onHello(meta []byte) error {
	hc, _, err := decodeHello(meta, false)
	if err != nil {
		return err
	}
	if hc.id == c.n.cfg.DaemonID {
		return c.refuse("peer claims this daemon's id", "claimed", hc.id)
	}
	hs := c.n.hello()
	c.metaC = append([]byte(nil), meta...)
	c.metaS = hs.append(nil)
	out := append(append([]byte(nil), c.metaS...), handshakeMAC(c.n.hsKey, labelServer, c.metaC, c.metaS)...)
	c.writeFrame(&header{typ: tHelloReply, metaLen: uint16(len(out))}, out)
	c.hs = hsAwaitAuth
	return nil
}

func (c *conn) onAuth(meta []byte) error {
	hc, _, err := decodeHello(c.metaC, false)
	if err != nil {
		return err
	}
	want := handshakeMAC(c.n.hsKey, labelClient, c.metaC, c.metaS)
	if !hmac.Equal(meta, want) {
		return c.refuse("authentication failed (wrong cluster key?)", "claimed", hc.id)
	}
	n := c.n
	if _, known := n.dir.Lookup(hc.id); !known {
		return c.refuse(reasonUnknownID, "claimed", hc.id)
	}
	p := n.peer(hc.id, true)
	p.mu.Lock()
	if p.isRetiredLocked(hc.epoch) {
		p.mu.Unlock()
		return c.refuse("stale epoch", "claimed", hc.id, "epoch", fmt.Sprintf("%#x", hc.epoch))
	}
	if p.epoch != 0 && hc.epoch != p.epoch && p.liveLocked() {
		held := p.epoch
		p.mu.Unlock()
		return c.refuse(reasonIDInUse, "claimed", hc.id, "epoch", fmt.Sprintf("%#x", hc.epoch),
			"live_epoch", fmt.Sprintf("%#x", held))
	}
	old := p.adoptEpochLocked(hc.epoch)
	p.blob = hc.blob
	c.peer, c.epoch = p, hc.epoch
	p.inbound[c] = struct{}{}
	p.wakeLocked()
	p.mu.Unlock()
	n.mu.Lock()
	n.handshaking.remove(c)
	n.mu.Unlock()
	c.metaC, c.metaS = nil, nil
	n.peerSeen(p, hc.addr, hc.epoch, old)
	c.writeFrame(&header{typ: tAuthOK}, nil)
	c.hs = hsReady
	n.log.Debug("peer authenticated", append(c.logger(), "epoch", fmt.Sprintf("%#x", hc.epoch))...)
	return nil
}

// authorize checks a data request's token and range and returns the
// acquired segment, or the status to answer with.
func (c *conn) authorize(tok []byte, need Rights, off uint64, ln uint32) (xfer.MemSegment, uint16, error) {
	n := c.n
	now := n.tokenNow()
	var name string
	var rights Rights
	if c.tok.raw != nil && bytes.Equal(tok, c.tok.raw) && now.UnixNano() < c.tok.expiry {
		name, rights = c.tok.name, c.tok.rights
	} else {
		t, err := verifyToken(tok, n.tokKey, n.cfg.DaemonID, n.epoch, 0, now)
		if err != nil {
			return nil, stPermission, err
		}
		c.tok = tokCache{raw: append(c.tok.raw[:0], tok...), name: t.name, rights: t.rights, expiry: t.expiry}
		name, rights = t.name, t.rights
	}
	if rights&need != need {
		return nil, stPermission, fmt.Errorf("%w: token grants %v, request needs %v", xfer.ErrPermission, rights, need)
	}
	seg, err := n.exp.Lookup(name)
	if err != nil || seg == nil {
		return nil, stNotFound, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if !seg.Acquire() {
		return nil, stNotFound, fmt.Errorf("%w: %q is closing", ErrNotFound, name)
	}
	b := seg.Bytes()
	if off > uint64(len(b)) || uint64(ln) > uint64(len(b))-off || off+uint64(ln) > seg.Size() {
		seg.Release()
		return nil, stInvalid, fmt.Errorf("%w: [%d, +%d) outside %q", xfer.ErrInvalid, off, ln, name)
	}
	return seg, stOK, nil
}

func (c *conn) refusedRequest(what string, err error) {
	c.n.log.Warn("refused peer request", append(c.logger(), "op", what, "reason", err.Error())...)
	c.peer.errs.Add(1)
}

// checkWindow drops a peer that lets our answers pile up beyond its
// flow-control window.
func (c *conn) checkWindow() error {
	if int64(c.g.OutboundBuffered()) > 2*c.n.cfg.MaxInflightBytes+(64<<10) {
		return fmt.Errorf("%w: peer exceeded its flow-control window (%d bytes unsent)", ErrProtocol, c.g.OutboundBuffered())
	}
	return nil
}

func (c *conn) onOpen(h *header, meta []byte) error {
	n := c.n
	name := string(meta)
	out := header{typ: tOpenResp, id: h.id}
	seg, err := n.exp.Lookup(name)
	if err != nil || seg == nil {
		out.status = stNotFound
		c.refusedRequest("open "+name, fmt.Errorf("%w: %q", ErrNotFound, name))
		c.writeFrame(&out, nil)
		return nil
	}
	if re, ok := n.exp.(RightsExporter); ok {
		if granted, ok := re.Granted(name); !ok || Rights(h.flags)&^granted != 0 {
			out.status = stPermission
			c.refusedRequest("open "+name, fmt.Errorf("%w: rights %d asked, %d granted", xfer.ErrPermission, h.flags, granted))
			c.writeFrame(&out, nil)
			return nil
		}
	}
	t := token{name: name, rights: Rights(h.flags), expiry: n.tokenNow().Add(n.cfg.TokenTTL).UnixNano(),
		issuer: n.cfg.DaemonID, epoch: n.epoch}
	tok := t.sign(n.tokKey)
	out.arg, out.metaLen = seg.Size(), uint16(len(tok))
	c.writeFrame(&out, tok)
	return nil
}

func (c *conn) onRead(h *header, meta []byte) error {
	c.dataReqs.Add(1)
	seg, st, err := c.authorize(meta, RightRead, h.arg, h.n)
	if err != nil {
		c.refusedRequest("read", err)
		c.writeFrame(&header{typ: tReadResp, id: h.id, status: st}, nil)
		return nil
	}
	putHeader(c.scratch[:], &header{typ: tReadResp, id: h.id, n: h.n})
	c.iov[0], c.iov[1] = c.scratch[:], seg.Bytes()[h.arg:h.arg+uint64(h.n)]
	_, _ = c.g.Writev(c.iov[:])
	c.iov[0], c.iov[1] = nil, nil
	seg.Release()
	c.peer.bytesOut.Add(uint64(h.n))
	return c.checkWindow()
}

func (c *conn) onWrite(h *header, meta []byte) error {
	c.dataReqs.Add(1)
	seg, st, err := c.authorize(meta, RightWrite, h.arg, h.n)
	c.rx = rxState{left: int(h.n), id: h.id, n: h.n, status: st}
	if err != nil {
		c.refusedRequest("write", err)
		return nil
	}
	c.rx.seg = seg
	c.rx.dst = seg.Bytes()[h.arg : h.arg+uint64(h.n)]
	return nil
}

func (c *conn) onNotify(h *header, meta []byte) error {
	tok, payload, err := decodeNotify(meta)
	if err != nil {
		return err
	}
	out := header{typ: tNotifyAck, id: h.id}
	n := c.n
	t, err := verifyToken(tok, n.tokKey, n.cfg.DaemonID, n.epoch, RightWrite, n.tokenNow())
	if err != nil {
		c.refusedRequest("notify", err)
		out.status = stPermission
	} else if err := n.exp.Deliver(t.name, payload); err != nil {
		n.log.Warn("notification not delivered", append(c.logger(), "segment", t.name, "err", err)...)
		out.status = stFailed
	}
	c.writeFrame(&out, nil)
	return nil
}

// payloadDone ends the payload of the current frame.
func (c *conn) payloadDone() error {
	if c.role == roleClient {
		pd := c.rx.p
		c.rx = rxState{}
		c.peer.mu.Lock()
		c.takeLocked(pd)
		c.peer.mu.Unlock()
		pd.finish(uint64(pd.n), nil)
		return nil
	}
	out := header{typ: tWriteResp, id: c.rx.id, status: c.rx.status}
	if c.rx.seg != nil {
		c.rx.seg.Release()
		out.n = c.rx.n
	}
	c.rx = rxState{}
	c.writeFrame(&out, nil)
	return c.checkWindow()
}

func statusErr(st uint16) error {
	switch st {
	case stPermission:
		return fmt.Errorf("%w: refused by the segment's owner", xfer.ErrPermission)
	case stInvalid:
		return fmt.Errorf("%w: rejected by the segment's owner", xfer.ErrInvalid)
	case stNotFound:
		return ErrNotFound
	}
	return fmt.Errorf("tcp: request failed on the peer (status %d)", st)
}

// handleResponse matches an answer to the request it names. Whoever takes
// a request out of its connection's table (this function, a broken
// connection, the reaper) ends it, exactly once.
func (c *conn) handleResponse(h *header, meta []byte) error {
	p := c.peer
	p.mu.Lock()
	pd := c.reqs[h.id]
	if pd == nil {
		_, late := c.timedOut[h.id]
		delete(c.timedOut, h.id)
		p.mu.Unlock()
		if late && h.payloadLen() == 0 {
			return nil
		}
		return fmt.Errorf("%w: answer (type %d) names unknown request %d", ErrProtocol, h.typ, h.id)
	}
	var want frameType
	switch pd.kind {
	case pkRead:
		want = tReadResp
	case pkWrite:
		want = tWriteResp
	case pkOpen:
		want = tOpenResp
	case pkNotify:
		want = tNotifyAck
	case pkExchange:
		want = tExchResp
	}
	if h.typ != want {
		p.mu.Unlock()
		return fmt.Errorf("%w: answer type %d to request %d, expected type %d", ErrProtocol, h.typ, h.id, want)
	}
	if h.status == stOK && (h.typ == tReadResp || h.typ == tWriteResp) && h.n != pd.n {
		p.mu.Unlock()
		return fmt.Errorf("%w: answer to request %d counts %d bytes, request had %d", ErrProtocol, h.id, h.n, pd.n)
	}
	if h.typ == tReadResp && h.status == stOK {
		// Stays registered until the payload is in, so a broken
		// connection still fails it.
		p.mu.Unlock()
		c.rx = rxState{left: int(h.n), dst: pd.ts.local[pd.loff : pd.loff+uint64(pd.n)], p: pd}
		return nil
	}
	c.takeLocked(pd)
	p.mu.Unlock()
	switch h.typ {
	case tOpenResp:
		if h.status != stOK {
			pd.finish(0, statusErr(h.status))
			return nil
		}
		pd.size = h.arg
		pd.token = append([]byte(nil), meta...)
		pd.finish(0, nil)
	case tExchResp:
		pd.status = h.status
		pd.token = append([]byte(nil), meta...)
		pd.finish(0, nil)
	case tNotifyAck:
		var err error
		if time.Now().UnixNano() > pd.deadline {
			err = fmt.Errorf("%w: notification acknowledged after its deadline", xfer.ErrTimeout)
		} else if h.status != stOK {
			err = fmt.Errorf("%w (status %d)", ErrNotifyRejected, h.status)
			if h.status == stPermission {
				err = fmt.Errorf("%w: %w", xfer.ErrPermission, err)
			}
		}
		pd.finish(0, err)
	default:
		if h.status != stOK {
			pd.finish(0, statusErr(h.status))
		} else {
			pd.finish(uint64(pd.n), nil)
		}
	}
	return nil
}

// takeLocked removes pd from its connection and returns its credit. The
// caller holds c.peer.mu.
func (c *conn) takeLocked(pd *pending) {
	delete(c.reqs, pd.id)
	c.due.remove(pd)
	if pd.isData() {
		c.inflight -= int64(pd.n)
		c.peer.inflight -= int64(pd.n)
		c.peer.wakeLocked()
	}
}
