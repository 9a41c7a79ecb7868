package tcp

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Token renewal. A remote segment stays open for as long as its holder
// keeps it, but the owner's tokens expire after its TokenTTL. Before a
// token has a third of its lifetime left, the node asks the owner for a new
// one on the same terms (segment, rights, epoch); requests keep presenting
// the old token until the new one is in. The owner grants it only while
// the segment is still exported with those rights: after an unexport, or
// with the owner restarted (another epoch), renewal fails, the old token
// runs out and requests fail with xfer.ErrPermission as before. A failed
// renewal is logged and retried after renewRetry while the token lasts.

// tokenNow is the time tokens are issued, checked and renewed by.
func (n *Node) tokenNow() time.Time {
	if n.cfg.tokenClock != nil {
		return n.cfg.tokenClock()
	}
	return time.Now()
}

// renewRetry is the pause after a failed renewal; renewCheckEvery is how
// often the reaper looks for tokens due.
const (
	renewRetry      = 2 * time.Second
	renewCheckEvery = 100 * time.Millisecond
)

// openToken asks p for a token to the access a with rights and checks
// what it answers: a token this cluster signed, issued by p for exactly
// that access and those rights. It also returns the segment's size.
func (n *Node) openToken(p *peer, a Access, rights Rights) (*credential, token, uint64, error) {
	segment := a.Name
	pd, err := n.askOpen(p, a, rights)
	// An open only asks for a token: one that went on a connection lost
	// before its answer (the peer restarted, and this node had not yet
	// read the old connection's end) is asked again, once, on a session
	// of its own.
	if err == nil && errors.Is(pd.err, ErrConnLost) && !n.closed.Load() {
		n.log.Debug("open asked again: its connection was lost", "peer", p.id, "segment", segment, "err", pd.err)
		pd, err = n.askOpen(p, a, rights)
	}
	if err != nil {
		return nil, token{}, 0, err
	}
	if pd.err != nil {
		return nil, token{}, 0, fmt.Errorf("open %s/%s: %w", p.id, segment, pd.err)
	}
	t, err := decodeToken(pd.token)
	if err != nil {
		return nil, token{}, 0, fmt.Errorf("%w: open %s/%s: %w", ErrProtocol, p.id, segment, err)
	}
	m := hmac.New(sha256.New, n.tokKey)
	m.Write(pd.token[:len(pd.token)-macLen])
	if !hmac.Equal(m.Sum(nil), t.mac) || t.issuer != p.id || t.access != a || t.rights != rights {
		return nil, token{}, 0, fmt.Errorf("%w: open %s/%s: the owner's token does not match the request", ErrProtocol, p.id, segment)
	}
	return &credential{token: pd.token, expiry: t.expiry, got: n.tokenNow().UnixNano()}, t, pd.size, nil
}

// askOpen sends one open of a with rights to p, over its session (dialed
// if there is none), and returns its ended request.
func (n *Node) askOpen(p *peer, a Access, rights Rights) (*pending, error) {
	if err := n.ensureSession(p, n.cfg.RequestTimeout); err != nil {
		return nil, err
	}
	pd, err := n.roundTrip(p, pkOpen, header{typ: tOpenReq, flags: uint16(rights)}, encodeOpen(a), n.cfg.RequestTimeout, false)
	if err != nil {
		return nil, err
	}
	if pd == nil {
		return nil, fmt.Errorf("%w: open %s/%s", xfer.ErrTimeout, p.id, a.Name)
	}
	return pd, nil
}

// renewDue starts a renewal for every open remote segment whose token is
// in the last third of its lifetime (the reaper calls it).
func (n *Node) renewDue(now time.Time) {
	ns := now.UnixNano()
	n.mu.Lock()
	var due []*Remote
	for r := range n.remotes {
		c := r.cred.Load()
		if ns < c.expiry-(c.expiry-c.got)/3 || ns < r.renewAfter.Load() || r.renewing.Load() {
			continue
		}
		due = append(due, r)
	}
	n.mu.Unlock()
	for _, r := range due {
		if !r.renewing.CompareAndSwap(false, true) {
			continue
		}
		n.lifeMu.RLock()
		if n.closed.Load() {
			n.lifeMu.RUnlock()
			r.renewing.Store(false)
			return
		}
		n.renewWG.Add(1)
		n.lifeMu.RUnlock()
		go func() {
			defer n.renewWG.Done()
			defer r.renewing.Store(false)
			n.renew(r)
		}()
	}
}

// renew replaces r's token with a fresh one on the same terms, or logs why
// it could not and schedules the next attempt.
func (n *Node) renew(r *Remote) {
	if r.closed.Load() {
		return
	}
	cred, t, size, err := n.openToken(r.peer, r.access, r.rights)
	if err == nil && (t.epoch != r.epoch || size != r.size) {
		err = fmt.Errorf("the owner answered for epoch %#x and %d bytes, the segment was opened at epoch %#x with %d",
			t.epoch, size, r.epoch, r.size)
	}
	if err != nil {
		r.renewAfter.Store(n.tokenNow().Add(renewRetry).UnixNano())
		n.log.Warn("could not renew a remote segment's token; it stops working when the token expires",
			"peer", r.peer.id, "segment", r.name, "expires", time.Unix(0, r.cred.Load().expiry).UTC().Format(time.RFC3339), "err", err)
		return
	}
	r.cred.Store(cred)
	n.log.Debug("remote segment's token renewed", "peer", r.peer.id, "segment", r.name,
		"expires", time.Unix(0, cred.expiry).UTC().Format(time.RFC3339))
}
