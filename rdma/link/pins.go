package link

import (
	"fmt"
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
// cannot be registered. The choice rides on the segment itself
// (tcp.Remote.Transport): routing reads it with one atomic load, no map,
// and nothing of it outlives the segment.

// pinWait bounds how long OpenRemote with TransportRDMA waits for the link
// and the segment's registration.
const pinWait = 20 * time.Second

// pinJob asks the worker to make r usable over RDMA now, before deadline
// (zero: none), when its caller stops waiting.
type pinJob struct {
	r        *tcp.Remote
	done     chan error // capacity 1
	deadline time.Time
}

// late reports whether the caller stopped waiting for j at now: a pin
// that waited for its peer's earlier work is then not run.
func (j pinJob) late(now time.Time) bool { return !j.deadline.IsZero() && !now.Before(j.deadline) }

// Pin records on r how its requests travel (tcp.Remote.SetTransport); with TransportRDMA it first has the
// worker connect the link and resolve r, failing when it cannot.
func (p *Links) Pin(r *tcp.Remote, via uint8) error {
	if via == wire.TransportRDMA {
		j := pinJob{r: r, done: make(chan error, 1), deadline: time.Now().Add(pinWait)}
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
		case <-p.stop:
			return xfer.ErrClosed // a pin waiting for its peer's earlier work
		case <-timer.C:
			return fmt.Errorf("%w: no rdma link to %s within %v", xfer.ErrTimeout, r.Peer(), pinWait)
		}
	}
	r.SetTransport(via)
	return nil
}

// prepare is the worker's part of pin: the link to r's peer and r's
// registration, made now whatever earlier attempts gave, the registration
// asked for until deadline (zero: resolveWait).
func (p *Links) prepare(r *tcp.Remote, deadline time.Time) error {
	l, err := p.link(r.Peer(), r.Epoch())
	if err != nil {
		return fmt.Errorf("rdma link to %s: %w", r.Peer(), err)
	}
	if err := p.resolve(l, r, deadline); err != nil {
		return fmt.Errorf("rdma registration of %s/%s: %w", r.Peer(), r.Name(), err)
	}
	p.say(r.Peer(), "rdma", "queue pairs up over the peer channel")
	return nil
}

// pinned is how r's requests travel (wire.TransportAuto when not
// pinned): what Pin recorded on r itself, read with one atomic load.
func pinned(r *tcp.Remote) uint8 { return r.Transport() }

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
