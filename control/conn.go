package control

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"syscall"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/session"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/wire"
)

const (
	initialReadBuf = 64 << 10
	maxFDGroups    = 4  // fd-carrying reads not yet matched to a frame
	oobSize        = 64 // room for a few fds; more set MSG_CTRUNC
)

// fdGroup is the fds one recvmsg brought and the stream range [lo, hi) it
// read. The kernel ends a read right after the message that carried fds, so
// they belong to the last frame that starts inside [lo, hi).
type fdGroup struct {
	fds    []int
	lo, hi uint64
	// lost: the message carried fds the kernel could not install (the
	// daemon was out of fds); fds holds those it did.
	lost bool
}

// cred is the connecting process as the kernel saw it when it connected
// (SO_PEERCRED, and SO_PEERGROUPS for its supplementary groups, read only
// when some tenant is chosen by gid).
type cred struct {
	Pid      int32
	Uid, Gid uint32
	Groups   []uint32
}

// conn is one client connection: its framing, fds and idempotency record,
// owned by the connection's serving goroutine, and its session, which the
// handlers dispatch to.
type conn struct {
	s    *Server
	uc   *net.UnixConn
	raw  syscall.RawConn
	cred cred
	id   uint64
	log  *slog.Logger

	// tenant is the peer's tenant, set at accept before serving starts;
	// nil for root or the daemon's uid let in without a tenant when the
	// server has tenants (no pool then).
	tenant *tenant
	// ss is what the client holds: the handlers' data plane.
	ss *session.Session

	// Read side: rbuf[rpos:rend] is unread; base is the stream offset of
	// rbuf[0].
	rbuf       []byte
	rpos, rend int
	base       uint64
	// armed: a read deadline of FrameTimeout is set for the frame that
	// has started arriving.
	armed  bool
	oob    []byte
	groups []fdGroup
	readFn func(fd uintptr) bool
	recv   recvState // the last recvmsg: its arguments and results

	b    *flatbuffers.Builder
	req  wire.Request
	resp wire.Response
	fds  []int // fds attributed to the current frame
	// fdsLost: fds sent with the current frame were lost (the daemon was
	// out of fds); the frame is answered RESOURCE_EXHAUSTED.
	fdsLost bool
	// passFD is an fd this connection made for the answer being sent (a
	// queue's memfd): closed once the answer is written, -1 when none.
	passFD int
	// passFD2 is a second fd for that answer, sent after passFD (a
	// queue's eventfd doorbell), -1 when none.
	passFD2 int
	idem    idemTable
	// idemForgotten counts the keys idem forgot past
	// Limits.MaxIdempotencyKeys.
	idemForgotten uint64
}

func newConn(s *Server, uc *net.UnixConn) (*conn, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	c := &conn{
		s:       s,
		uc:      uc,
		raw:     raw,
		id:      s.nextConn.Add(1),
		oob:     make([]byte, unix.CmsgSpace(oobSize)),
		b:       flatbuffers.NewBuilder(1024),
		passFD:  -1,
		passFD2: -1,
	}
	if c.cred, err = peerCred(raw); err != nil {
		return nil, err
	}
	if s.needGroups {
		if c.cred.Groups, err = peerGroups(raw, c.cred); err != nil {
			return nil, err
		}
	}
	c.log = s.log.With("conn", c.id, "pid", c.cred.Pid, "uid", c.cred.Uid)
	c.ss = session.New(s.host, c.id, c.log)
	c.ss.SetGone(c.peerGone)
	c.readFn = c.recvmsg
	return c, nil
}

// setTenant makes t the connection's tenant (nil: none, no pool).
func (c *conn) setTenant(t *tenant) {
	c.tenant = t
	if t == nil {
		return
	}
	c.log = c.log.With("tenant", t.Name)
	c.ss.SetTenant(t.Name, t.Pool, t.Store, c.log)
	c.ss.SetGrants(t.Grants)
}

// who are the attributes that say which connection a rate-limited line is
// about: the server's log has none of c.log's.
func (c *conn) who() []slog.Attr {
	a := []slog.Attr{slog.Uint64("conn", c.id), slog.Int("pid", int(c.cred.Pid)), slog.Uint64("uid", uint64(c.cred.Uid))}
	if c.tenant != nil {
		a = append(a, slog.String("tenant", c.tenant.Name))
	}
	return a
}

// refuse answers a connection that will not be served and closes it.
func (c *conn) refuse(err error) {
	c.fail(0, status.CodeOf(err))
	c.uc.Write(wire.EncodeResponse(c.b, &c.resp)) //nolint:errcheck // closing anyway
	c.uc.Close()
}

// fail makes c.resp the answer to request id with code and its generic
// message (the detail stays in the log).
func (c *conn) fail(id uint64, code Code) {
	c.resp.Reset(id)
	c.resp.Status, c.resp.Message = code, []byte(wire.StatusText(code))
}

// fill reads more bytes into rbuf[rend:], collecting any fds.
func (c *conn) fill() error {
	if err := c.raw.Read(c.readFn); err != nil {
		return err
	}
	r := &c.recv
	if r.err != nil {
		return os.NewSyscallError("recvmsg", r.err)
	}
	lo := c.base + uint64(c.rend)
	if r.oobn > 0 || r.flags&unix.MSG_CTRUNC != 0 {
		fds, err := parseRights(c.oob[:r.oobn])
		// Truncated control data with room left in oob is the kernel
		// failing to install the fds (the daemon is out of them: EMFILE):
		// the frame they came with is refused RESOURCE_EXHAUSTED and the
		// connection goes on. Truncation for want of room is a client
		// sending more fds than any message takes.
		lost := false
		if r.flags&unix.MSG_CTRUNC != 0 && err == nil {
			if r.oobn+unix.CmsgSpace(4) <= len(c.oob) {
				lost = true
			} else {
				err = fmt.Errorf("%w: control data truncated", ErrUnexpectedFD)
			}
		}
		if err == nil && len(c.groups) >= maxFDGroups {
			err = fmt.Errorf("%w: too many fd-carrying messages in flight", ErrUnexpectedFD)
		}
		if err != nil {
			closeFDs(fds)
			return err
		}
		if len(fds) > 0 || lost {
			c.groups = append(c.groups, fdGroup{fds: fds, lo: lo, hi: lo + uint64(r.n), lost: lost})
		}
	}
	if r.n == 0 {
		return io.EOF
	}
	c.rend += r.n
	return nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, os.NewSyscallError("parse control message", err)
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		f, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			closeFDs(fds)
			return nil, os.NewSyscallError("parse SCM_RIGHTS", err)
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd) //nolint:errcheck // nothing to do about it
	}
}

// readFrame returns the next frame body and attributes fds to it (c.fds).
// The body aliases rbuf until the next call. Waiting for a frame's first
// byte has no time limit; once it has come, the rest must come within
// FrameTimeout (a read deadline, set only when the frame did not arrive
// whole in one read).
func (c *conn) readFrame() ([]byte, error) {
	c.closeStray()
	for c.rend-c.rpos < wire.FrameHeader {
		if err := c.ensure(wire.FrameHeader); err != nil {
			return nil, err
		}
		if c.rend > c.rpos {
			if err := c.arm(); err != nil {
				return nil, err
			}
		}
		if err := c.fill(); err != nil {
			if c.rend > c.rpos && errors.Is(err, io.EOF) {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	n := int(binary.LittleEndian.Uint32(c.rbuf[c.rpos:]))
	if n > c.s.cfg.MaxFrame {
		return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrFrameTooLarge, n, c.s.cfg.MaxFrame)
	}
	if err := c.ensure(wire.FrameHeader + n); err != nil {
		return nil, err
	}
	for c.rend-c.rpos < wire.FrameHeader+n {
		if err := c.arm(); err != nil {
			return nil, err
		}
		if err := c.fill(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	if c.armed {
		c.armed = false
		if err := c.uc.SetReadDeadline(time.Time{}); err != nil {
			return nil, err
		}
	}
	start := c.base + uint64(c.rpos)
	frame := c.rbuf[c.rpos+wire.FrameHeader : c.rpos+wire.FrameHeader+n]
	c.rpos += wire.FrameHeader + n
	next := c.base + uint64(c.rpos)
	c.fds, c.fdsLost = c.fds[:0], false
	for i := 0; i < len(c.groups); i++ {
		g := c.groups[i]
		if g.lo <= start && start < g.hi && next >= g.hi {
			c.fds = append(c.fds, g.fds...)
			c.fdsLost = c.fdsLost || g.lost
			c.groups = append(c.groups[:i], c.groups[i+1:]...)
			i--
		}
	}
	return frame, nil
}

// arm sets the read deadline by which the frame that has started must be
// whole, once per frame.
func (c *conn) arm() error {
	if c.armed {
		return nil
	}
	c.armed = true
	return c.uc.SetReadDeadline(time.Now().Add(c.s.cfg.FrameTimeout))
}

// closeStray closes fds whose read was consumed entirely by earlier frames
// that did not take them (they came with no frame's first bytes).
func (c *conn) closeStray() {
	pos := c.base + uint64(c.rpos)
	for i := 0; i < len(c.groups); i++ {
		if c.groups[i].hi <= pos {
			if len(c.groups[i].fds) > 0 {
				c.s.logs.strayFDs.Event(append(c.who(), slog.Int("n", len(c.groups[i].fds)))...)
			}
			closeFDs(c.groups[i].fds)
			c.groups = append(c.groups[:i], c.groups[i+1:]...)
			i--
		}
	}
}

// ensure makes room for need bytes from rpos, compacting or growing rbuf.
func (c *conn) ensure(need int) error {
	if c.rpos+need <= len(c.rbuf) {
		return nil
	}
	unread := c.rend - c.rpos
	if need <= len(c.rbuf) {
		copy(c.rbuf, c.rbuf[c.rpos:c.rend])
	} else {
		size := max(need, initialReadBuf)
		nb := make([]byte, size)
		copy(nb, c.rbuf[c.rpos:c.rend])
		c.rbuf = nb
	}
	c.base += uint64(c.rpos)
	c.rpos, c.rend = 0, unread
	return nil
}

// write sends one frame, with fd attached when fd >= 0, and after it the
// fds in more that are >= 0.
func (c *conn) write(frame []byte, fd int, more ...int) error {
	if fd < 0 {
		_, err := c.uc.Write(frame)
		return err
	}
	fds := []int{fd}
	for _, f := range more {
		if f >= 0 {
			fds = append(fds, f)
		}
	}
	n, _, err := c.uc.WriteMsgUnix(frame, unix.UnixRights(fds...), nil)
	if err == nil && n < len(frame) {
		_, err = c.uc.Write(frame[n:])
	}
	return err
}

// serve reads, handles and answers frames until the peer goes away, a frame
// is bad or the server closes the connection; then it releases everything
// the connection holds.
func (c *conn) serve() {
	defer c.release()
	defer c.uc.Close()
	c.rbuf = make([]byte, initialReadBuf)
	c.log.Debug("client connected", "gid", c.cred.Gid)
	for {
		frame, err := c.readFrame()
		if err != nil {
			c.readFailed(err)
			return
		}
		if !c.serveFrame(frame) {
			return
		}
	}
}

func (c *conn) readFailed(err error) {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		c.log.Debug("client disconnected")
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.s.logs.frameTimeout.Event(append(c.who(), slog.Int("buffered", c.rend-c.rpos),
			slog.Duration("frame_timeout", c.s.cfg.FrameTimeout))...)
		c.uc.SetWriteDeadline(time.Now().Add(c.s.cfg.FrameTimeout)) //nolint:errcheck // best effort
		c.fail(0, codeDeadlineExceeded)
		c.write(wire.EncodeResponse(c.b, &c.resp), -1) //nolint:errcheck // closing anyway
	case errors.Is(err, ErrFrameTooLarge), errors.Is(err, ErrUnexpectedFD):
		c.s.logs.badFrame.Event(append(c.who(), slog.String("err", err.Error()))...)
		c.fail(0, status.CodeOf(err))
		c.write(wire.EncodeResponse(c.b, &c.resp), -1) //nolint:errcheck // closing anyway
	default:
		c.log.Debug("closing connection", "err", err)
	}
}

// serveFrame decodes and handles one frame and writes the answer; false
// means the connection must close.
func (c *conn) serveFrame(frame []byte) bool {
	if err := wire.DecodeRequest(frame, c.s.dlim, &c.req); err != nil {
		closeFDs(c.fds)
		c.fds = c.fds[:0]
		if errors.Is(err, wire.ErrLimit) && !errors.Is(err, wire.ErrMalformed) {
			// The frame is whole and only breaks a limit: refuse this call,
			// answering its id, and keep serving the connection.
			c.log.Debug("request refused: breaks a decode limit", "request_id", c.req.Ctx.RequestID, "err", err)
			c.fail(c.req.Ctx.RequestID, status.CodeOf(err))
			if err := c.write(wire.EncodeResponse(c.b, &c.resp), -1); err != nil {
				c.log.Debug("closing connection: write failed", "err", err)
				return false
			}
			return true
		}
		c.s.logs.undecodable.Event(append(c.who(), slog.String("err", err.Error()))...)
		c.fail(0, status.CodeOf(err))
		c.write(wire.EncodeResponse(c.b, &c.resp), -1) //nolint:errcheck // closing anyway
		return false
	}
	c.s.reqs.count(c.req.Kind())
	outFD := -1
	var out []byte
	if !c.s.beginRequest() {
		closeFDs(c.fds)
		c.fds = c.fds[:0]
		out = c.errorFrame(ErrUnavailable)
	} else {
		out, outFD = c.handleSafe()
		c.s.endRequest()
	}
	more := -1
	if outFD >= 0 && outFD == c.passFD {
		more = c.passFD2
	}
	err := c.write(out, outFD, more)
	if c.passFD >= 0 {
		closeFDs([]int{c.passFD}) // the client has its own copy now (or never will)
		c.passFD = -1
	}
	if c.passFD2 >= 0 {
		closeFDs([]int{c.passFD2})
		c.passFD2 = -1
	}
	if err != nil {
		c.log.Debug("closing connection: write failed", "err", err)
		return false
	}
	return true
}

// handleSafe runs the handler; a panic becomes INTERNAL for this request,
// and the connection keeps being served, but the server is unhealthy from
// then on (Server.Health): what the handler held may be left inconsistent.
func (c *conn) handleSafe() (out []byte, fd int) {
	defer func() {
		if r := recover(); r != nil {
			c.s.panics.Add(1)
			closeFDs(c.fds)
			c.fds = c.fds[:0]
			c.log.Error("panic while serving a request", "kind", c.req.Kind().String(),
				"request_id", c.req.Ctx.RequestID, "panic", r, "stack", string(debug.Stack()))
			out, fd = c.errorFrame(errPanic), -1
			if c.passFD >= 0 {
				closeFDs([]int{c.passFD})
				c.passFD = -1
			}
			if c.passFD2 >= 0 {
				closeFDs([]int{c.passFD2})
				c.passFD2 = -1
			}
		}
	}()
	return c.handle()
}

// errorFrame encodes an error response for the current request.
func (c *conn) errorFrame(err error) []byte {
	c.fail(c.req.Ctx.RequestID, status.CodeOf(err))
	return wire.EncodeResponse(c.b, &c.resp)
}

// takeFD returns the one fd the current frame must carry.
func (c *conn) takeFD() (int, error) {
	switch len(c.fds) {
	case 0:
		return -1, ErrMissingFD
	case 1:
		fd := c.fds[0]
		c.fds = c.fds[:0]
		return fd, nil
	}
	closeFDs(c.fds)
	c.fds = c.fds[:0]
	return -1, fmt.Errorf("%w: more than one", ErrUnexpectedFD)
}

// errPanic stands for a recovered panic in CodeOf.
var errPanic = errors.New("control: internal error")

// release frees everything the connection holds: what its session holds
// (see session.Session.Close), then the fds of frames never served; its
// idempotency keys may then run afresh on another connection.
func (c *conn) release() {
	c.ss.Close()
	for _, g := range c.groups {
		closeFDs(g.fds)
	}
	c.groups = nil
	closeFDs(c.fds)
	c.fds = nil
	c.s.idem.closed(c.id)
}
