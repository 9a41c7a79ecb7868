package tcp

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/tensorcast/tensorcast/xfer"
)

// Limits of request/response exchanges on the peer channel.
const (
	// MaxExchange is the largest request or response body of an exchange.
	// Kind and body travel in one frame's metadata (at most 64 KiB).
	MaxExchange = 60 << 10
	// MaxExchangeKind is the longest exchange kind.
	MaxExchangeKind = 64
	// MaxExchangeHandlers bounds the handlers running at once on a node,
	// and its nested ones apart (HandleNested); a request beyond that is
	// answered busyReason (ErrPeerBusy).
	MaxExchangeHandlers = 16
	// maxExchangeReason bounds the failure reason sent back to the peer.
	maxExchangeReason = 256
)

// Handler serves one kind of exchange: it gets the authenticated peer's id
// and epoch and the request body (owned by the handler) and returns the
// response body (at most MaxExchange bytes). An error is answered to the
// peer as ErrExchange with the error's text (cut to 256 bytes).
//
// Each request runs on its own goroutine, owned by the node: at most 16
// run at once, and 16 nested ones apart (HandleNested); more are answered
// "busy". Close waits for the running ones, so a handler must finish in
// bounded time.
type Handler func(from string, epoch uint64, req []byte) ([]byte, error)

// Handle registers h for exchanges of kind (1..64 bytes); a nil h removes
// the handler. Requests of a kind without a handler are answered with
// ErrNoHandler.
func (n *Node) Handle(kind string, h Handler) error {
	return register(n, n.handlers, kind, exchHandler{h: h}, h == nil)
}

// HandleNested is Handle for a handler that makes exchanges of its own and
// waits on them. Nested handlers run under a bound of their own (16 more
// at once), apart from the others: however many of them wait on peers,
// they never take the room of the handlers that answer those peers, here
// or, by the same rule, there. Two nodes whose nested handlers all wait
// on each other (a removal at each waiting on drops at the other) still
// serve each other's other exchanges, so those waits end with answers,
// not with "busy" or a deadline. A nested handler must ask peers only
// for exchanges whose handlers are not nested, or such a cycle could fill
// both bounds.
func (n *Node) HandleNested(kind string, h Handler) error {
	return register(n, n.handlers, kind, exchHandler{h: h, nested: true}, h == nil)
}

// exchHandler is a registered exchange handler, and whether it is nested
// (HandleNested).
type exchHandler struct {
	h      Handler
	nested bool
}

func (n *Node) handler(kind string) exchHandler { return lookup(n, n.handlers, kind) }

// register puts h into m (one of the node's handler tables, made with the
// node) under kind, or removes kind's entry when none; hmu guards them.
func register[H any](n *Node, m map[string]H, kind string, h H, none bool) error {
	if kind == "" || len(kind) > MaxExchangeKind {
		return fmt.Errorf("%w: exchange kind of %d bytes (want 1..%d)", xfer.ErrInvalid, len(kind), MaxExchangeKind)
	}
	n.hmu.Lock()
	defer n.hmu.Unlock()
	if none {
		delete(m, kind)
	} else {
		m[kind] = h
	}
	return nil
}

func lookup[H any](n *Node, m map[string]H, kind string) H {
	n.hmu.RLock()
	defer n.hmu.RUnlock()
	return m[kind]
}

// Exchange sends req to peer's handler of kind over the authenticated
// peer channel (dialing it when there is no session) and returns its
// response. It waits at most timeout (0 or more than the node's
// RequestTimeout means RequestTimeout). Errors: xfer.ErrInvalid for a bad
// kind or a body over MaxExchange, ErrUnknownPeer, ErrNoHandler,
// ErrExchange (the handler failed, with its reason), xfer.ErrTimeout,
// ErrConnLost, xfer.ErrClosed.
func (n *Node) Exchange(peerID, kind string, req []byte, timeout time.Duration) ([]byte, error) {
	return n.ExchangeAt(peerID, 0, kind, req, timeout)
}

// ExchangeAt is Exchange with the peer pinned to epoch: a peer that runs
// another epoch (it restarted) does not run the handler and the call
// fails with ErrStaleEpoch. Epoch 0 accepts any.
func (n *Node) ExchangeAt(peerID string, epoch uint64, kind string, req []byte, timeout time.Duration) ([]byte, error) {
	if n.closed.Load() {
		return nil, xfer.ErrClosed
	}
	if kind == "" || len(kind) > MaxExchangeKind || len(req) > MaxExchange {
		return nil, fmt.Errorf("%w: exchange %q of %d bytes (kind 1..%d bytes, body at most %d)",
			xfer.ErrInvalid, kind, len(req), MaxExchangeKind, MaxExchange)
	}
	if peerID == n.cfg.DaemonID {
		return nil, fmt.Errorf("%w: %q is this daemon", xfer.ErrInvalid, peerID)
	}
	if timeout <= 0 || timeout > n.cfg.RequestTimeout {
		timeout = n.cfg.RequestTimeout
	}
	p, err := n.peerFor(peerID)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := n.ensureSession(p, timeout); err != nil {
		return nil, fmt.Errorf("exchange %q with %s: %w", kind, peerID, err)
	}
	if timeout -= time.Since(start); timeout <= 0 {
		return nil, fmt.Errorf("%w: exchange %q with %s: its time went on dialing", xfer.ErrTimeout, kind, peerID)
	}
	meta := make([]byte, 0, 1+len(kind)+len(req))
	meta = append(appendStr8(meta, kind), req...)
	pd, err := n.roundTrip(p, pkExchange, header{typ: tExchReq, arg: epoch}, meta, timeout, true)
	if err != nil {
		return nil, err
	}
	if pd == nil {
		return nil, fmt.Errorf("%w: exchange %q with %s: no answer within %v", xfer.ErrTimeout, kind, peerID, timeout)
	}
	if pd.err != nil {
		return nil, fmt.Errorf("exchange %q with %s: %w", kind, peerID, pd.err)
	}
	switch pd.status {
	case stOK:
		return pd.token, nil
	case stNotFound:
		return nil, fmt.Errorf("%w: %q on %s", ErrNoHandler, kind, peerID)
	case stPermission:
		return nil, fmt.Errorf("%w: exchange %q: %s no longer runs epoch %#x", ErrStaleEpoch, kind, peerID, epoch)
	case stInvalid:
		return nil, fmt.Errorf("%w: exchange %q refused by %s: %s", xfer.ErrInvalid, kind, peerID, pd.token)
	}
	if string(pd.token) == busyReason {
		return nil, fmt.Errorf("%w: %q on %s: %w", ErrExchange, kind, peerID, ErrPeerBusy)
	}
	return nil, fmt.Errorf("%w: %q on %s: %s", ErrExchange, kind, peerID, pd.token)
}

// busyReason is the answer to an exchange beyond MaxExchangeHandlers.
const busyReason = "busy: too many exchanges in progress"

// onExchange serves an exchange request: the handler runs on a goroutine
// of its own, and the answer goes back through the event loop.
func (c *conn) onExchange(h *header, meta []byte) error {
	kind, body, err := decodeExchange(meta)
	if err != nil {
		return err
	}
	n := c.n
	if h.arg != 0 && h.arg != n.epoch {
		c.refusedRequest("exchange "+kind, fmt.Errorf("%w: addressed to epoch %#x", ErrStaleEpoch, h.arg))
		c.writeFrame(&header{typ: tExchResp, id: h.id, status: stPermission}, nil)
		return nil
	}
	if ih := n.inlineHandler(kind); ih != nil {
		return c.serveInline(h, kind, body, ih)
	}
	eh := n.handler(kind)
	hf := eh.h
	if hf == nil {
		c.refusedRequest("exchange "+kind, ErrNoHandler)
		c.writeFrame(&header{typ: tExchResp, id: h.id, status: stNotFound}, nil)
		return nil
	}
	sem := n.exchSem
	if eh.nested {
		sem = n.nestSem
	}
	select {
	case sem <- struct{}{}:
	default:
		reason := []byte(busyReason)
		c.writeFrame(&header{typ: tExchResp, id: h.id, status: stFailed, metaLen: uint16(len(reason))}, reason)
		return nil
	}
	req := append([]byte(nil), body...)
	from, epoch, id := c.peer.id, c.epoch, h.id
	n.exchWG.Add(1)
	go func() {
		defer n.exchWG.Done()
		resp, err := hf(from, epoch, req)
		// The handler's room is free before its answer leaves: a peer
		// that has the answer finds the room free, as it would expect.
		<-sem
		out := header{typ: tExchResp, id: id}
		switch {
		case err != nil:
			n.log.Warn("exchange handler failed", "peer", from, "kind", kind, "err", err)
			out.status, resp = stFailed, []byte(err.Error())
			if len(resp) > maxExchangeReason {
				resp = resp[:maxExchangeReason]
			}
		case len(resp) > MaxExchange:
			n.log.Error("exchange handler answered too much", "peer", from, "kind", kind, "bytes", len(resp), "max", MaxExchange)
			out.status, resp = stFailed, []byte("response too large")
		}
		out.metaLen = uint16(len(resp))
		hdr := make([]byte, hdrLen)
		putHeader(hdr, &out)
		// A connection that closed meanwhile takes the answer with it; the
		// requester sees ErrConnLost. The callback runs on the event loop.
		_ = c.g.AsyncWritev([][]byte{hdr, resp}, func(g gnet.Conn, err error) error {
			if err != nil || c.gone {
				return nil
			}
			if err := c.checkWindow(); err != nil {
				c.drop(err)
				return g.Close()
			}
			return nil
		})
		if h := exchAnswered.Load(); h != nil {
			(*h)()
		}
	}()
	return nil
}

// exchAnswered, when set (by tests), runs on an exchange's goroutine after
// its answer is queued.
var exchAnswered atomic.Pointer[func()]
