package link

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Transport chosen per remote segment. OpenRemote with TransportTCP pins
// the segment's requests to tcp; with TransportRDMA the open itself brings
// the link up and resolves the segment (or fails), and from then on its
// requests move by RDMA or fail with UNAVAILABLE: none goes to tcp, whether
// the link is down, its queue pairs are being rebuilt or the local buffer
// cannot be registered. TransportAuto segments are not recorded here.

// pinWait bounds how long OpenRemote with TransportRDMA waits for the link
// and the segment's registration.
const pinWait = 20 * time.Second

// pins are the remote segments opened with a transport other than auto.
type pins struct {
	m sync.Map     // *tcp.Remote → uint8 (wire.TransportTCP or TransportRDMA)
	n atomic.Int64 // entries in m: routing skips the lookup while 0
}

// pinJob asks the worker to make r usable over RDMA now.
type pinJob struct {
	r    *tcp.Remote
	done chan error
}

// pin records how r's requests travel; with TransportRDMA it first has the
// worker connect the link and resolve r, failing when it cannot.
func (p *Links) Pin(r *tcp.Remote, via uint8) error {
	if via == wire.TransportRDMA {
		j := pinJob{r: r, done: make(chan error, 1)}
		timer := time.NewTimer(pinWait)
		defer timer.Stop()
		select {
		case p.prep <- j:
		case <-p.stop:
			return xfer.ErrClosed
		case <-timer.C:
			return fmt.Errorf("%w: the rdma worker is busy", xfer.ErrTimeout)
		}
		select {
		case err := <-j.done:
			if err != nil {
				return err
			}
		case <-timer.C:
			return fmt.Errorf("%w: no rdma link to %s within %v", xfer.ErrTimeout, r.Peer(), pinWait)
		}
	}
	if _, loaded := p.pins.m.LoadOrStore(r, via); !loaded {
		p.pins.n.Add(1)
	}
	return nil
}

// prepare is the worker's part of pin: the link to r's peer and r's
// registration, made now whatever earlier attempts gave.
func (p *Links) prepare(r *tcp.Remote) error {
	l, err := p.link(r.Peer(), r.Epoch())
	if err != nil {
		return fmt.Errorf("rdma link to %s: %w", r.Peer(), err)
	}
	if err := p.resolve(l, r); err != nil {
		return fmt.Errorf("rdma registration of %s/%s: %w", r.Peer(), r.Name(), err)
	}
	p.say(r.Peer(), "rdma", "queue pairs up over the peer channel")
	return nil
}

// pinned is how r's requests travel (wire.TransportAuto when not
// pinned). It does not allocate.
func (p *Links) pinned(r *tcp.Remote) uint8 {
	if p.pins.n.Load() == 0 {
		return wire.TransportAuto
	}
	if v, ok := p.pins.m.Load(r); ok {
		return v.(uint8)
	}
	return wire.TransportAuto
}

// prunePins forgets the pins of closed remote segments (the worker's tick).
func (p *Links) prunePins() {
	if p.pins.n.Load() == 0 {
		return
	}
	p.pins.m.Range(func(k, _ any) bool {
		if r := k.(*tcp.Remote); closedRemote(r) {
			p.pins.m.Delete(r)
			p.pins.n.Add(-1)
		}
		return true
	})
}

// errRDMAOnly is why a request to a segment opened with TransportRDMA
// failed instead of going to tcp.
func errRDMAOnly(t *xfer.Task, why string) error {
	name := "?"
	if r, ok := t.Target.(*tcp.Remote); ok {
		name = r.Peer() + "/" + r.Name()
	}
	return fmt.Errorf("%w: %s was opened with transport rdma and %s", peer.ErrUnavailable, name, why)
}

// rdmaRefusal is the router's answer for a request to a segment opened with
// TransportRDMA that cannot move by RDMA now: it fails the tasks.
type rdmaRefusal struct {
	why string
	s   *rdmaStats
}

func (o *rdmaRefusal) Name() string      { return "rdma" }
func (o *rdmaRefusal) Cancel(*xfer.Task) {}
func (o *rdmaRefusal) Close() error      { return nil }
func (o *rdmaRefusal) Submit(ts []*xfer.Task) (int, error) {
	o.s.unavailable.Add(uint64(len(ts)))
	for _, t := range ts {
		t.Done(0, errRDMAOnly(t, o.why))
	}
	return len(ts), nil
}

// rdmaRefusals makes a plane's two answers once, so that routing to them
// does not allocate.
func rdmaRefusals(s *rdmaStats) (linkDown, localMissing *rdmaRefusal) {
	return &rdmaRefusal{why: "its rdma link is down", s: s},
		&rdmaRefusal{why: "the local segment has no rdma registration", s: s}
}
