package tcp

import (
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Data exchanges: one round trip that asks a peer's handler and brings
// bytes back with its answer, straight into a buffer of the asker's. The
// store across hosts reads a value by key with one (the holder checks its
// reader limit, sends the value and is done with it when the send is),
// where a claim exchange followed by a READ costs two round trips.
//
// The request is an exchange request of a kind the peer serves with an
// InlineHandler; the answer is an exchange answer whose frame carries,
// after its body, n payload bytes (header field n; only on an OK answer
// to such a request). A daemon that does not serve the kind answers "no
// handler" (ErrNoHandler) as for any exchange, so the asker can fall back
// to the two round trips; a daemon that does not know data exchanges is
// never sent one of their answers.
//
// Neither side starts a goroutine: the asker writes the request from the
// calling goroutine (ExchangeInto does not block: without a session it
// fails at once), the peer's handler runs on the connection's event loop
// and writes the answer there, and the asker's done runs on its event
// loop (or, on timeout, the reaper; on a lost connection, the loop that
// closes it).

// InlineHandler serves one kind of data exchange on the connection's event
// loop: it must not block. req is valid only during the call. It answers
// by calling reply exactly once with the answer's body (at most
// MaxExchange bytes) and a payload (at most the node's largest data
// frame), which are written (or copied into the connection's buffer)
// before reply returns: the payload's memory is the handler's again as
// soon as reply returns. An error returned without a reply is answered as
// a failed exchange (ErrExchange, with the error's text).
type InlineHandler func(from string, epoch uint64, req []byte, reply func(resp, payload []byte)) error

// HandleInline registers h for data exchanges of kind (1..64 bytes); a nil
// h removes it. A kind has an inline handler or a Handler, not both: the
// inline one is looked up first.
func (n *Node) HandleInline(kind string, h InlineHandler) error {
	return register(n, n.inline, kind, h, h == nil)
}

func (n *Node) inlineHandler(kind string) InlineHandler { return lookup(n, n.inline, kind) }

// ExchangeDone receives a data exchange's answer: its body (the asker's
// own copy) and how many payload bytes landed at the start of dst, or why
// it failed (errors as Exchange's).
type ExchangeDone func(resp []byte, got int, err error)

// ExchangeInto sends req to peer's inline handler of kind, addressed to
// its run epoch (0: any), and calls done exactly once with the answer,
// whose payload lands in dst (at most len(dst) bytes; a longer one drops
// the connection as a protocol error). len(dst) counts against the flow
// control window of the connection it goes on until the exchange ends.
// It does not block: with no session to the peer (ErrConnLost), or no
// room for len(dst) in its windows (ErrWindowFull), it fails at once and
// the caller takes another way; otherwise it returns nil and done runs
// later on another goroutine, or before ExchangeInto returns. dst is
// written until done runs and never after: an answer that comes after the
// deadline is discarded, and a payload still arriving at the deadline
// drops its connection.
func (n *Node) ExchangeInto(peerID string, epoch uint64, kind string, req, dst []byte, deadline time.Time, done ExchangeDone) error {
	if n.closed.Load() {
		return xfer.ErrClosed
	}
	if kind == "" || len(kind) > MaxExchangeKind || len(req) > MaxExchange || uint64(len(dst)) > uint64(n.lim.maxPayload) {
		return fmt.Errorf("%w: data exchange %q of %d bytes into %d (kind 1..%d bytes, body at most %d, payload at most %d)",
			xfer.ErrInvalid, kind, len(req), len(dst), MaxExchangeKind, MaxExchange, n.lim.maxPayload)
	}
	if peerID == n.cfg.DaemonID {
		return fmt.Errorf("%w: %q is this daemon", xfer.ErrInvalid, peerID)
	}
	p, err := n.peerFor(peerID)
	if err != nil {
		return err
	}
	meta := make([]byte, 0, 1+len(kind)+len(req))
	meta = append(appendStr8(meta, kind), req...)
	pd := &pending{node: n, kind: pkExchange, dst: dst, deadline: deadline.UnixNano(), peerID: peerID, xkind: kind, epoch: epoch}
	pd.cb = done
	pd.refs.Store(2)
	// The answer's payload counts against the connection's flow-control
	// window as a READ's does: the peer drops a connection whose answers
	// pile up beyond it, and every request on it would fail.
	c, st, err := n.tryRegister(p, pd, int64(len(dst)))
	switch {
	case err != nil:
		return err
	case st == needDials: // no session: fails, nothing dialed
		return errNoSession(p)
	case st == needRoom:
		return fmt.Errorf("%w: %d bytes to %s", ErrWindowFull, len(dst), peerID)
	}
	h := header{typ: tExchReq, arg: epoch, id: pd.id, metaLen: uint16(len(meta))}
	putHeader(pd.hdr[:], &h)
	pd.bufs[0], pd.bufs[1] = pd.hdr[:], meta
	c.send(pd, 2)
	return nil
}

// exchangeResult is what an exchange's answer (pd, ended with err) means
// to the asker: the body, or the error that says why not.
func exchangeResult(pd *pending, err error) ([]byte, error) {
	kind, peerID := pd.xkind, pd.peerID
	if err != nil {
		return nil, fmt.Errorf("exchange %q with %s: %w", kind, peerID, err)
	}
	switch pd.status {
	case stOK:
		return pd.token, nil
	case stNotFound:
		return nil, fmt.Errorf("%w: %q on %s", ErrNoHandler, kind, peerID)
	case stPermission:
		return nil, fmt.Errorf("%w: exchange %q: %s no longer runs epoch %#x", ErrStaleEpoch, kind, peerID, pd.epoch)
	case stInvalid:
		return nil, fmt.Errorf("%w: exchange %q refused by %s: %s", xfer.ErrInvalid, kind, peerID, pd.token)
	}
	return nil, fmt.Errorf("%w: %q on %s: %s", ErrExchange, kind, peerID, pd.token)
}

// finishData ends a data exchange: done gets the body and the payload's
// length, or the error.
func (pd *pending) finishData(err error) {
	resp, err := exchangeResult(pd, err)
	got := pd.got
	if err != nil {
		got = 0
	}
	pd.cb(resp, got, err)
}

// serveInline runs an inline handler on the event loop and writes its
// answer there.
func (c *conn) serveInline(h *header, kind string, body []byte, hf InlineHandler) error {
	n := c.n
	// The reply closure captures the id, not h: h is the event loop's
	// header of the frame being handled, and a closure that kept it would
	// move every frame's header to the heap (an allocation per frame).
	id := h.id
	replied := false
	reply := func(resp, payload []byte) {
		if replied {
			return
		}
		replied = true
		out := header{typ: tExchResp, id: id}
		switch {
		case len(resp) > MaxExchange || uint64(len(payload)) > uint64(n.lim.maxPayload):
			n.log.Error("inline exchange handler answered too much", "peer", c.peer.id, "kind", kind,
				"bytes", len(resp), "payload", len(payload))
			resp, payload = []byte("response too large"), nil
			out.status = stFailed
		}
		out.metaLen, out.n = uint16(len(resp)), uint32(len(payload))
		putHeader(c.scratch[:], &out)
		iov := [3][]byte{c.scratch[:], resp, payload}
		_, _ = c.g.Writev(iov[:])
		c.peer.bytesOut.Add(uint64(len(payload)))
	}
	if err := hf(c.peer.id, c.epoch, body, reply); err != nil && !replied {
		n.log.Debug("inline exchange handler failed", "peer", c.peer.id, "kind", kind, "err", err)
		reason := []byte(err.Error())
		if len(reason) > maxExchangeReason {
			reason = reason[:maxExchangeReason]
		}
		c.writeFrame(&header{typ: tExchResp, id: h.id, status: stFailed, metaLen: uint16(len(reason))}, reason)
		return nil
	}
	if !replied {
		reason := []byte("the handler gave no answer")
		c.writeFrame(&header{typ: tExchResp, id: h.id, status: stFailed, metaLen: uint16(len(reason))}, reason)
	}
	return nil
}

// MaxDataPayload is the largest payload a data exchange's answer carries
// (the node's largest data frame).
func (n *Node) MaxDataPayload() int { return int(n.lim.maxPayload) }
