package tcp

// The handshake, both sides: the dialer's clientHandshake on the plain
// connection, the listener's onHello and onAuth on the event loop, the MAC
// that binds both hellos, and refusals.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// errRefused: the handshake was refused and already logged.
var errRefused = errors.New("refused")

// beforeAuthOK, set by tests only, runs on the event loop just before a
// server connection answers a good auth; one atomic load otherwise.
var beforeAuthOK atomic.Pointer[func(*conn)]

// Reasons a peer that proved the cluster key is refused (see the package
// doc).
const (
	reasonUnknownID = "daemon id not among this daemon's peers"
	reasonIDInUse   = "daemon id held by a live session of another epoch"
)

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

// maxRefuseReason bounds what the log keeps of the reason a peer gives
// for refusing us (a frame's metadata holds up to 8 KiB of it).
const maxRefuseReason = 256

// refuseReason is the reason a refusal's metadata gives, as the log keeps
// it: at most maxRefuseReason bytes.
func refuseReason(meta []byte) string {
	return string(meta[:min(len(meta), maxRefuseReason)])
}

// refuse logs a refusal (rate-limited per reason, see refusalLog), tells
// the peer why and ends the connection. reason is a fixed string.
func (c *conn) refuse(reason string, kv ...any) error {
	c.n.refusals.note(c.n.log, reason, time.Now(), append(c.logger(), kv...)...)
	c.writeFrame(&header{typ: tRefuse, metaLen: uint16(len(reason))}, []byte(reason))
	return errRefused
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
	if h := beforeAuthOK.Load(); h != nil {
		(*h)(c)
	}
	c.writeFrame(&header{typ: tAuthOK}, nil)
	c.hs = hsReady
	n.log.Debug("peer authenticated", append(c.logger(), "epoch", fmt.Sprintf("%#x", hc.epoch))...)
	return nil
}

// hello is what this node says about itself in a handshake.
func (n *Node) hello() hello {
	h := hello{id: n.cfg.DaemonID, epoch: n.epoch, addr: n.addr, blob: n.cfg.Blob,
		maxFrame: uint32(n.cfg.MaxFrame), window: uint64(n.cfg.MaxInflightBytes)}
	_, _ = rand.Read(h.nonce[:])
	return h
}

// clientHandshake runs the dialing side of the handshake on the plain
// connection, before it joins an event loop.
func (n *Node) clientHandshake(nc net.Conn, p *peer) (hello, error) {
	_ = nc.SetDeadline(time.Now().Add(n.cfg.HandshakeTimeout))
	hc := n.hello()
	metaC := hc.append(nil)
	if err := writeRaw(nc, &header{typ: tHello, metaLen: uint16(len(metaC))}, metaC); err != nil {
		return hello{}, fmt.Errorf("%w: handshake with %s: %w", ErrConnLost, p.id, err)
	}
	h, meta, err := n.readRaw(nc)
	if err != nil {
		return hello{}, fmt.Errorf("handshake with %s: %w", p.id, err)
	}
	if h.typ == tRefuse {
		reason := refuseReason(meta)
		n.log.Warn("peer refused us", "peer", p.id, "reason", reason)
		return hello{}, fmt.Errorf("%w: %s: %s", ErrRefused, p.id, reason)
	}
	if h.typ != tHelloReply {
		return hello{}, fmt.Errorf("%w: handshake with %s: frame %d", ErrProtocol, p.id, h.typ)
	}
	hs, mac, err := decodeHello(meta, true)
	if err != nil {
		return hello{}, fmt.Errorf("handshake with %s: %w", p.id, err)
	}
	body := meta[:len(meta)-macLen]
	refuse := func(reason string, err error) (hello, error) {
		n.log.Warn("refusing peer", "peer", p.id, "reason", reason, "epoch", fmt.Sprintf("%#x", hs.epoch))
		_ = writeRaw(nc, &header{typ: tRefuse, metaLen: uint16(len(reason))}, []byte(reason))
		p.errs.Add(1)
		return hello{}, fmt.Errorf("%w: %s: %s", err, p.id, reason)
	}
	if !hmac.Equal(mac, handshakeMAC(n.hsKey, labelServer, metaC, body)) {
		return refuse("authentication failed (wrong cluster key?)", ErrAuth)
	}
	if hs.id != p.id {
		return refuse(fmt.Sprintf("answered as daemon %q", hs.id), ErrAuth)
	}
	p.mu.Lock()
	stale := p.isRetiredLocked(hs.epoch)
	p.mu.Unlock()
	if stale {
		return refuse("stale epoch", ErrStaleEpoch)
	}
	auth := handshakeMAC(n.hsKey, labelClient, metaC, body)
	if err := writeRaw(nc, &header{typ: tAuth, metaLen: macLen}, auth); err != nil {
		return hello{}, fmt.Errorf("%w: handshake with %s: %w", ErrConnLost, p.id, err)
	}
	h, meta, err = n.readRaw(nc)
	if err != nil {
		return hello{}, fmt.Errorf("handshake with %s: %w", p.id, err)
	}
	switch h.typ {
	case tAuthOK:
	case tRefuse:
		reason := refuseReason(meta)
		n.log.Warn("peer refused us", "peer", p.id, "reason", reason)
		return hello{}, fmt.Errorf("%w: %s: %s", ErrRefused, p.id, reason)
	default:
		return hello{}, fmt.Errorf("%w: handshake with %s: frame %d", ErrProtocol, p.id, h.typ)
	}
	_ = nc.SetDeadline(time.Time{})
	return hs, nil
}

func writeRaw(w io.Writer, h *header, meta []byte) error {
	b := make([]byte, hdrLen, hdrLen+len(meta))
	putHeader(b, h)
	_, err := w.Write(append(b, meta...))
	return err
}

func (n *Node) readRaw(r io.Reader) (header, []byte, error) {
	var hb [hdrLen]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return header{}, nil, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	h, err := decodeHeader(hb[:], n.lim)
	if err != nil {
		return h, nil, err
	}
	if h.payloadLen() != 0 {
		return h, nil, fmt.Errorf("%w: payload during handshake", ErrProtocol)
	}
	meta := make([]byte, h.metaLen)
	if _, err := io.ReadFull(r, meta); err != nil {
		return h, nil, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return h, meta, nil
}
