package tcp

// Serving a peer's requests on the listener side: checking tokens and the
// window (authorize, checkWindow), and the Open, Read, Write and Notify
// frames.

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// authorize checks a data request's token and range and returns the
// acquired segment, or the status to answer with. The export is looked up
// for the token's access on every request: a tenant the exporter no
// longer lets in, an export gone, or one that no longer grants the
// request's right ends the access whatever the token says.
func (c *conn) authorize(tok []byte, need Rights, off uint64, ln uint32) (xfer.MemSegment, uint16, error) {
	n := c.n
	a, err := c.checkToken(tok, need)
	if err != nil {
		return nil, stPermission, err
	}
	seg, granted, err := n.exp.Lookup(a)
	if err != nil || seg == nil {
		return nil, lookupStatus(err), lookupErr(a, err)
	}
	if granted&need != need {
		// The token outlives what it was signed for: the export under
		// its name may have been narrowed since (unexported, and exported
		// again for reading only).
		return nil, stPermission, fmt.Errorf("%w: %q grants %v now, request needs %v", xfer.ErrPermission, a.Name, granted, need)
	}
	if !seg.Acquire() {
		return nil, stNotFound, fmt.Errorf("%w: %q is closing", ErrNotFound, a.Name)
	}
	b := seg.Bytes()
	if off > uint64(len(b)) || uint64(ln) > uint64(len(b))-off || off+uint64(ln) > seg.Size() {
		seg.Release()
		return nil, stInvalid, fmt.Errorf("%w: [%d, +%d) outside %q", xfer.ErrInvalid, off, ln, a.Name)
	}
	return seg, stOK, nil
}

// lookupErr is what the log says of a request the Exporter's Lookup
// refused.
func lookupErr(a Access, err error) error {
	if err == nil {
		err = ErrNotFound
	}
	return fmt.Errorf("%q (tenant %q, of %q): %w", a.Name, a.Tenant, a.Owner, err)
}

// lookupStatus is the answer to a request the Exporter's Lookup refused:
// permission denied when the access's tenant may not reach the export,
// else not found.
func lookupStatus(err error) uint16 {
	if errors.Is(err, xfer.ErrPermission) {
		return stPermission
	}
	return stNotFound
}

// checkToken verifies a request's token (once per token and connection:
// c.tok remembers the last one) and returns the access it grants need
// on.
func (c *conn) checkToken(tok []byte, need Rights) (Access, error) {
	n := c.n
	now := n.tokenNow()
	var a Access
	var rights Rights
	if c.tok.raw != nil && bytes.Equal(tok, c.tok.raw) && now.UnixNano() < c.tok.expiry {
		a, rights = c.tok.access, c.tok.rights
	} else {
		t, err := verifyToken(tok, n.tokKey, n.cfg.DaemonID, n.epoch, 0, now)
		if err != nil {
			return Access{}, err
		}
		c.tok = tokCache{raw: append(c.tok.raw[:0], tok...), access: t.access, rights: t.rights, expiry: t.expiry}
		a, rights = t.access, t.rights
	}
	if rights&need != need {
		return Access{}, fmt.Errorf("%w: token grants %v, request needs %v", xfer.ErrPermission, rights, need)
	}
	return a, nil
}

// Verify checks a capability token this node issued (signature, issuer,
// epoch, expiry) and that it grants need, and returns the access it was
// issued for; every failure wraps xfer.ErrPermission. The RDMA plane
// checks with it the token a peer shows for an export's registration.
func (n *Node) Verify(tok []byte, need Rights) (Access, error) {
	t, err := verifyToken(tok, n.tokKey, n.cfg.DaemonID, n.epoch, need, n.tokenNow())
	return t.access, err
}

// refusedRequest counts a refused peer request and logs it, at most a
// line per what and refuseLogEvery (a peer can send them by the
// thousand).
func (c *conn) refusedRequest(what string, err error, kv ...any) {
	c.n.refusals.note(c.n.log, "request refused: "+what, time.Now(), append(append(c.logger(), kv...), "err", err.Error())...)
	c.peer.errs.Add(1)
}

// checkWindow drops a peer that lets our answers pile up beyond its
// flow-control window. It runs after every frame handled on a server
// connection (onTraffic) and when an exchange handler's answer is written
// (onExchange): small answers count too (opens, refusals, acks), or a peer
// that sends such requests and never reads would grow the buffer without
// bound.
func (c *conn) checkWindow() error {
	if int64(c.g.OutboundBuffered()) > 2*c.n.cfg.MaxInflightBytes+(64<<10) {
		return fmt.Errorf("%w: peer exceeded its flow-control window (%d bytes unsent)", ErrProtocol, c.g.OutboundBuffered())
	}
	return nil
}

func (c *conn) onOpen(h *header, meta []byte) error {
	n := c.n
	out := header{typ: tOpenResp, id: h.id}
	a, err := decodeOpen(meta)
	if err != nil {
		return err
	}
	seg, granted, err := n.exp.Lookup(a)
	if err != nil || seg == nil {
		out.status = lookupStatus(err)
		c.refusedRequest("open", lookupErr(a, err))
		c.writeFrame(&out, nil)
		return nil
	}
	if Rights(h.flags)&^granted != 0 {
		out.status = stPermission
		c.refusedRequest("open", fmt.Errorf("%w: rights %d asked, %d granted", xfer.ErrPermission, h.flags, granted), accessLog(a)...)
		c.writeFrame(&out, nil)
		return nil
	}
	t := token{access: a, rights: Rights(h.flags), expiry: n.tokenNow().Add(n.cfg.TokenTTL).UnixNano(),
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
	return nil
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
	a, err := c.checkToken(tok, RightWrite)
	if err != nil {
		c.refusedRequest("notify", err)
		out.status = stPermission
	} else if err := n.exp.Deliver(a, payload); err != nil {
		// Rate-limited as every refusal: a peer that notifies a full or
		// unsubscribed export over and over would fill the log.
		c.refusedRequest("notify", err, accessLog(a)...)
		out.status = stFailed
		if errors.Is(err, xfer.ErrPermission) {
			out.status = stPermission
		}
	}
	c.writeFrame(&out, nil)
	return nil
}

// accessLog is a as a log line names it.
func accessLog(a Access) []any {
	return []any{"segment", a.Name, "tenant", a.Tenant, "owner", a.Owner}
}

// payloadDone ends the payload of the current frame.
func (c *conn) payloadDone() error {
	if c.role == roleClient {
		pd, sum, crc := c.rx.p, c.rx.sum, c.rx.crc
		c.rx = rxState{}
		if pd == nil {
			return nil // a late answer's payload, dropped
		}
		c.peer.mu.Lock()
		c.takeLocked(pd)
		c.peer.mu.Unlock()
		if sum != nil {
			// Before the task can end: its Done waits for this slice.
			*sum = xfer.Sum{CRC: crc, Taken: true}
		}
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
	return nil
}
