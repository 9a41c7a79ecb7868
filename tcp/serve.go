package tcp

// Serving a peer's requests on the listener side: checking tokens and the
// window (authorize, checkWindow), and the Open, Read, Write and Notify
// frames.

import (
	"bytes"
	"fmt"

	"github.com/tensorcast/tensorcast/xfer"
)

// authorize checks a data request's token and range and returns the
// acquired segment, or the status to answer with.
func (c *conn) authorize(tok []byte, need Rights, off uint64, ln uint32) (xfer.MemSegment, uint16, error) {
	n := c.n
	name, err := c.checkToken(tok, need)
	if err != nil {
		return nil, stPermission, err
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

// checkToken verifies a request's token (once per token and connection:
// c.tok remembers the last one) and returns the segment name it grants
// need on.
func (c *conn) checkToken(tok []byte, need Rights) (string, error) {
	n := c.n
	now := n.tokenNow()
	var name string
	var rights Rights
	if c.tok.raw != nil && bytes.Equal(tok, c.tok.raw) && now.UnixNano() < c.tok.expiry {
		name, rights = c.tok.name, c.tok.rights
	} else {
		t, err := verifyToken(tok, n.tokKey, n.cfg.DaemonID, n.epoch, 0, now)
		if err != nil {
			return "", err
		}
		c.tok = tokCache{raw: append(c.tok.raw[:0], tok...), name: t.name, rights: t.rights, expiry: t.expiry}
		name, rights = t.name, t.rights
	}
	if rights&need != need {
		return "", fmt.Errorf("%w: token grants %v, request needs %v", xfer.ErrPermission, rights, need)
	}
	return name, nil
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
	name, err := c.checkToken(tok, RightWrite)
	if err != nil {
		c.refusedRequest("notify", err)
		out.status = stPermission
	} else if err := n.exp.Deliver(name, payload); err != nil {
		n.log.Warn("notification not delivered", append(c.logger(), "segment", name, "err", err)...)
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
