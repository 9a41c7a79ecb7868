package link

// The links' lifecycle on their worker: connecting a link to a peer
// and resolving its segments off the submit path, retiring links whose peer
// restarted or went away, and the acceptor's side of a peer's queue pairs.

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
)

// worker connects links and resolves segments that route asked for (the
// registration queue registers client buffers). A peer whose link failed stays on tcp for
// linkRetry; a segment that cannot be resolved (its owner could not
// register it) or a buffer that could not be registered stays on tcp while
// the rest of its peer's requests use rdma.
//
// The exchanges with a peer that this needs run on a goroutine of their
// own (peerRun), one at a time per peer: each may wait for the node's
// request timeout, and a peer that takes them and never answers must hold
// up its own segments only, not the links, pins and ticks of every other
// peer. A route's job for a peer whose work runs is dropped (a later
// request asks again); a pin waits for its turn.
func (p *Links) worker() {
	defer p.wg.Done()
	type failure struct {
		epoch uint64
		at    time.Time
	}
	failedPeer := map[string]failure{}      // peer → its last failed link
	failedSeg := map[*tcp.Remote]struct{}{} // segments left on tcp
	// busy are the peers whose work runs, with the pins that wait for it.
	busy := map[string][]pinJob{}
	ended := make(chan peerWork)
	tick := time.NewTicker(linkCheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-tick.C:
			p.checkLinks()
			p.regs.expire(now)
		case j := <-p.prep:
			if waiting, ok := busy[j.r.Peer()]; ok {
				busy[j.r.Peer()] = append(waiting, j)
				continue
			}
			busy[j.r.Peer()] = nil
			p.startPeer(j.r, j, ended)
		case l := <-p.retire:
			p.retireLink(l, "the peer runs a new epoch")
		case r := <-p.jobs:
			if f, ok := failedPeer[r.Peer()]; ok && f.epoch == r.Epoch() && time.Since(f.at) < linkRetry {
				continue
			}
			if _, ok := failedSeg[r]; ok {
				continue
			}
			if _, ok := busy[r.Peer()]; ok {
				continue
			}
			busy[r.Peer()] = nil
			p.startPeer(r, pinJob{}, ended)
		case w := <-ended:
			switch {
			case w.linkErr != nil:
				failedPeer[w.r.Peer()] = failure{w.r.Epoch(), time.Now()}
				p.say(w.r.Peer(), "tcp", w.linkErr.Error())
			case errors.Is(w.segErr, xfer.ErrClosed):
				// The link was retired while r resolved on it (the
				// worker retires links while peers' work runs), or r
				// was closed: nothing to remember of r.
			case errors.Is(w.segErr, errOwnerBusy):
				// Its owner is busy (registering it): its requests use tcp
				// meanwhile (counted), and a later one asks again.
				p.log.Info("remote segment uses tcp while its owner is busy", "peer", w.r.Peer(), "segment", w.r.Name(),
					"why", w.segErr.Error())
			case w.segErr != nil:
				if len(failedSeg) >= 4096 {
					for k := range failedSeg {
						if closedRemote(k) {
							delete(failedSeg, k)
						}
					}
				}
				failedSeg[w.r] = struct{}{}
				p.log.Info("remote segment uses tcp", "peer", w.r.Peer(), "segment", w.r.Name(), "why", w.segErr.Error())
			}
			waiting := busy[w.r.Peer()]
			for len(waiting) > 0 && waiting[0].late(time.Now()) {
				waiting[0].done <- fmt.Errorf("%w: no rdma link to %s within %v", xfer.ErrTimeout, w.r.Peer(), pinWait)
				waiting = waiting[1:]
			}
			if len(waiting) == 0 {
				delete(busy, w.r.Peer())
				continue
			}
			busy[w.r.Peer()] = waiting[1:]
			p.startPeer(waiting[0].r, waiting[0], ended)
		}
	}
}

// peerWork is what one run of a peer's work tells the worker when it
// ends: why r's link or r's resolution failed (a pin's failures are its
// caller's, not remembered).
type peerWork struct {
	r               *tcp.Remote
	linkErr, segErr error
}

// startPeer runs r's peer's work on a goroutine of its own (peerRun):
// the pin j when it has a done channel, else a route's job for r.
func (p *Links) startPeer(r *tcp.Remote, j pinJob, ended chan<- peerWork) {
	p.wg.Add(1)
	go p.peerRun(r, j, ended)
}

// peerRun brings r's peer's link up and resolves r, then tells the worker
// (unless the links are closing: nobody listens then). It ends with its
// exchanges, at the latest when the node closes or times them out.
func (p *Links) peerRun(r *tcp.Remote, j pinJob, ended chan<- peerWork) {
	defer p.wg.Done()
	w := peerWork{r: r}
	switch {
	case j.done != nil:
		j.done <- p.prepare(r, j.deadline)
	default:
		l, err := p.link(r.Peer(), r.Epoch())
		if err != nil {
			w.linkErr = err
			break
		}
		if w.segErr = p.resolve(l, r, time.Time{}); w.segErr == nil {
			p.say(r.Peer(), "rdma", "queue pairs up over the peer channel")
		}
	}
	select {
	case ended <- w:
	case <-p.stop:
	}
}

// linkCheckEvery is how often the worker compares the links with the peer
// plane's view of their peers.
const linkCheckEvery = 250 * time.Millisecond

// checkLinks retires the links whose peer lost its tcp session or runs
// another epoch. A dead peer's queue pairs may not report the loss for a
// long time (each work request waits out the transport's retries), so the
// peer channel is the witness: closing the link fails what it has posted
// at once, and later requests go to tcp, which fails them or, once the
// peer is back, gets a new link made.
func (p *Links) checkLinks() {
	links := *p.links.Load()
	if len(links) == 0 {
		return
	}
	for _, s := range p.node.Peers() {
		l := links[s.ID]
		switch {
		case l == nil:
		case s.Epoch != l.epoch:
			p.retireLink(l, "the peer runs a new epoch")
		case !s.Connected:
			p.retireLink(l, "the peer's tcp session is gone")
		}
	}
}

// retireLink drops a link: requests to its segments go to tcp (which
// refuses those of an old epoch), and a later use makes a new link.
func (p *Links) retireLink(l *rdmaLink, why string) {
	p.mu.Lock()
	old := *p.links.Load()
	if old[l.peer] != l || p.closed {
		p.mu.Unlock()
		return
	}
	m := maps.Clone(old)
	delete(m, l.peer)
	p.links.Store(&m)
	p.mu.Unlock()
	l.dropKeys()
	_ = l.tr.Close()
	p.mu.Lock()
	delete(p.said, l.peer)
	p.mu.Unlock()
	p.stats.linksClosed.Add(1)
	p.log.Info("rdma link closed", "peer", l.peer, "epoch", fmt.Sprintf("%#x", l.epoch), "why", why)
}

// epochChannel is a link's peer channel: exchanges pinned to the epoch the
// link was made with, so that its queue pairs never reconnect to a
// restarted peer (whose pool and keys are new); a stale epoch retires the
// link.
//
// A peer whose node has no exchange handler free (tcp.ErrPeerBusy: the
// request was refused before any handler ran, so it is safe to send again)
// is asked again after a pause, within the exchange's timeout: a link made
// while the peer is busy otherwise fails, and the peer stays on tcp for
// linkRetry.
type epochChannel struct{ l *rdmaLink }

func (c epochChannel) Exchange(peer, kind string, req []byte, timeout time.Duration) ([]byte, error) {
	p := c.l.p
	if timeout <= 0 || timeout > p.node.RequestTimeout() {
		timeout = p.node.RequestTimeout()
	}
	deadline := time.Now().Add(timeout)
	resp, err := p.node.ExchangeAt(peer, c.l.epoch, kind, req, timeout)
	var pauses busyPauses
	defer pauses.end()
	for errors.Is(err, tcp.ErrPeerBusy) {
		p.stats.peerBusy.Add(1)
		again, werr := pauses.wait(p.stop, deadline)
		if werr != nil {
			return nil, werr
		}
		if !again {
			break
		}
		resp, err = p.node.ExchangeAt(peer, c.l.epoch, kind, req, time.Until(deadline))
	}
	if errors.Is(err, tcp.ErrStaleEpoch) {
		select {
		case p.retire <- c.l:
		default:
		}
	}
	return resp, err
}

// link returns peer's link of epoch, connecting it when there is none.
func (p *Links) link(peer string, epoch uint64) (*rdmaLink, error) {
	if l := (*p.links.Load())[peer]; l != nil && l.epoch == epoch {
		return l, nil
	}
	return p.connect(peer, epoch)
}

// resolveWait bounds how long resolving a segment for a route's request
// asks its owner (a pin's own deadline bounds a pin's): as long as one
// exchange waits by default (the node's request timeout) for an owner
// registering the export.
const resolveWait = 30 * time.Second

// Pauses between the requests a busy peer refused (busyAnswer, or
// tcp.ErrPeerBusy): they double from the first to the last.
const (
	firstBusyPause = 10 * time.Millisecond
	lastBusyPause  = 500 * time.Millisecond
)

// busyPauses paces the requests to a peer that answered busy: each wait
// pauses twice as long as the one before, from firstBusyPause to
// lastBusyPause. Its timer is made once; end stops it.
type busyPauses struct {
	timer *time.Timer
	pause time.Duration
}

// wait pauses before the next request: again is false when that pause
// would end past deadline (the caller gives up, nothing waited), and the
// error xfer.ErrClosed when the links close meanwhile.
func (b *busyPauses) wait(stop <-chan struct{}, deadline time.Time) (again bool, err error) {
	if b.pause == 0 {
		b.pause = firstBusyPause
	} else {
		b.pause = min(2*b.pause, lastBusyPause)
	}
	if time.Until(deadline) < b.pause {
		return false, nil
	}
	if b.timer == nil {
		b.timer = time.NewTimer(b.pause)
	} else {
		b.timer.Reset(b.pause)
	}
	select {
	case <-b.timer.C:
		return true, nil
	case <-stop:
		return false, fmt.Errorf("rdma: %w", xfer.ErrClosed)
	}
}

// end stops the timer, if a wait made one.
func (b *busyPauses) end() {
	if b.timer != nil {
		b.timer.Stop()
	}
}

// resolve asks r's owner for its registration of r (address, size, keys),
// before deadline (zero: resolveWait from now), and puts the keys in r's
// RDMA slot, owned by l.
func (p *Links) resolve(l *rdmaLink, r *tcp.Remote, deadline time.Time) error {
	if k := rdma.KeysOf(r); k != nil && k.Owner() == any(l) {
		return nil
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(resolveWait)
	}
	resp, err := p.askRegion(l, r, deadline)
	if err != nil {
		return err
	}
	var reg rdma.RemoteRegion
	if err := reg.UnmarshalBinary(resp); err != nil {
		return err
	}
	if reg.Size != r.Size() {
		return fmt.Errorf("registration of %d bytes for a %d-byte segment", reg.Size, r.Size())
	}
	var k *rdma.Keys
	k, err = rdma.RemoteKeys(reg, l, func() { l.forgetKeys(r, k) })
	if err != nil {
		return err
	}
	if !l.addKeys(r, k) {
		return fmt.Errorf("%w: the rdma link to %s was retired", xfer.ErrClosed, r.Peer())
	}
	if !r.Regs().Set(xfer.SlotRDMA, k) {
		l.forgetKeys(r, k)
		if closedRemote(r) {
			return fmt.Errorf("%w: %s/%s was closed", xfer.ErrClosed, r.Peer(), r.Name())
		}
		return fmt.Errorf("%s/%s: its rdma slot holds another link's keys", r.Peer(), r.Name())
	}
	return nil
}

// askRegion asks r's owner for its registration of r until deadline:
// an owner that answers busy is asked again after a pause, whether it is
// registering (busyAnswer) or its node has no exchange handler free
// (tcp.ErrPeerBusy): either passes, and remembering the segment on tcp
// for it would keep it there for good.
func (p *Links) askRegion(l *rdmaLink, r *tcp.Remote, deadline time.Time) ([]byte, error) {
	var pauses busyPauses
	defer pauses.end()
	start, busy := time.Now(), 0
	busyErr := func() error {
		return fmt.Errorf("%w: %s/%s: answered busy %d times in %v", errOwnerBusy, r.Peer(), r.Name(),
			busy, time.Since(start).Round(time.Millisecond))
	}
	for {
		left := time.Until(deadline)
		switch {
		case left <= 0 && busy > 0:
			return nil, busyErr()
		case left <= 0:
			return nil, fmt.Errorf("%w: no time left to ask %s for the registration of %s", xfer.ErrTimeout, r.Peer(), r.Name())
		}
		resp, err := p.node.ExchangeAt(r.Peer(), l.epoch, segmentTokenExchange, r.Token(), left)
		if errors.Is(err, tcp.ErrNoHandler) && r.Access() == (tcp.Access{Name: r.Name()}) {
			// A daemon before tenants: it serves its (default) exports by
			// name, and a segment opened without tenants is one of those.
			resp, err = p.node.ExchangeAt(r.Peer(), l.epoch, segmentExchange, []byte(r.Name()), left)
		}
		if !errors.Is(err, tcp.ErrPeerBusy) && (err != nil || !bytes.Equal(resp, busyAnswer)) {
			return resp, err
		}
		busy++
		p.stats.ownerBusy.Add(1)
		again, err := pauses.wait(p.stop, deadline)
		if err != nil {
			return nil, err
		}
		if !again {
			return nil, busyErr()
		}
	}
}

// closedRemote reports whether r was closed (its holder let it go).
func closedRemote(r *tcp.Remote) bool {
	if !r.Acquire() {
		return true
	}
	r.Release()
	return false
}

// connect makes the link to peer at epoch, replacing an older one.
func (p *Links) connect(peer string, epoch uint64) (*rdmaLink, error) {
	tr, err := p.dev.NewTransport()
	if err != nil {
		return nil, err
	}
	l := &rdmaLink{p: p, peer: peer, epoch: epoch, tr: tr, tcp: p.node, segs: map[*tcp.Remote]*rdma.Keys{}}
	start := time.Now()
	if err := tr.Connect(rdma.ChannelPeer{Ch: epochChannel{l}, ID: peer}); err != nil {
		_ = tr.Close()
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = tr.Close()
		return nil, xfer.ErrClosed
	}
	m := maps.Clone(*p.links.Load())
	prev := m[peer]
	m[peer] = l
	p.links.Store(&m)
	p.mu.Unlock()
	if prev != nil {
		// The peer restarted: its old queue pairs lead nowhere.
		prev.dropKeys()
		_ = prev.tr.Close()
	}
	p.stats.linksMade.Add(1)
	p.log.Info("rdma link up", "peer", peer, "epoch", fmt.Sprintf("%#x", epoch), "took", time.Since(start).Round(time.Microsecond).String())
	return l, nil
}

// say logs, once per peer and change, which transport carries its
// requests and why.
func (p *Links) say(peer, transport, why string) {
	p.mu.Lock()
	was := p.said[peer]
	p.said[peer] = transport
	p.mu.Unlock()
	if was == transport {
		return
	}
	if transport == "rdma" {
		p.log.Info("peer requests from the pool use rdma", "peer", peer, "why", why)
	} else {
		p.log.Info("peer requests use tcp", "peer", peer, "why", why)
	}
}

// accept is the acceptor's lookup: the transport a peer's link lands on,
// made on first use and remade when the peer restarts. Making one creates
// its queue pairs and completion queues, and dropping the old one destroys
// theirs: device calls, made outside mu, which every link's set-up and
// retirement takes. Two exchanges of one peer that both find no transport
// make one each; the first published is used and the other closed.
func (p *Links) accept(from string, epoch uint64) (*rdma.Transport, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, xfer.ErrClosed
	}
	if a, ok := p.accepted[from]; ok && a.epoch == epoch {
		p.mu.Unlock()
		return a.t, nil
	}
	// Close waits for it before the device closes.
	p.accepting.Add(1)
	defer p.accepting.Done()
	p.mu.Unlock()
	t, err := p.dev.NewTransport()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	a, ok := p.accepted[from]
	switch {
	case p.closed:
		p.mu.Unlock()
		_ = t.Close()
		return nil, xfer.ErrClosed
	case ok && a.epoch == epoch:
		p.mu.Unlock()
		_ = t.Close()
		return a.t, nil
	}
	p.accepted[from] = acceptedPeer{t: t, epoch: epoch}
	p.mu.Unlock()
	if ok {
		_ = a.t.Close() // the peer restarted: its old queue pairs lead nowhere
	}
	p.log.Info("rdma: accepting a peer's queue pairs", "peer", from, "epoch", fmt.Sprintf("%#x", epoch))
	return t, nil
}
