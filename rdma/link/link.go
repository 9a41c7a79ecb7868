package link

// The link: the transport one peer's remote targets get when RDMA carries
// them, and how it splits a submission between the rdma transport, the
// peer channel (notified writes) and tcp.

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// rdmaLink is the transport the router returns for one peer's remote
// targets when RDMA carries them. A task carrying a notification moves by
// RDMA too; the notification follows on the peer channel (notify.go).
type rdmaLink struct {
	p     *Links
	peer  string
	epoch uint64 // the peer's epoch the link was made with
	tr    *rdma.Transport
	tcp   *tcp.Node // where what rdma does not carry goes

	// mu guards segs: the remote segments the link resolved, with the
	// owner's keys it put in each one's RDMA slot, where the router and
	// the transport read them. Not read on the hot path.
	mu   sync.Mutex
	segs map[*tcp.Remote]*rdma.Keys
}

var _ xfer.Transport = (*rdmaLink)(nil)

// Name implements xfer.Transport.
func (l *rdmaLink) Name() string { return "rdma" }

// Cancel implements xfer.Transport: posted RDMA work is not withdrawn; a
// task the link handed to tcp and still waiting in the node's queue ends
// at once (the node ignores tasks it does not hold).
func (l *rdmaLink) Cancel(t *xfer.Task) {
	l.tr.Cancel(t)
	l.tcp.Cancel(t)
}

// Close implements xfer.Transport; Links.Close closes the link's transport.
func (l *rdmaLink) Close() error { return nil }

// Submit implements xfer.Transport: runs of tasks go to the rdma transport,
// a task carrying a notification on its own (submitNotified), and tasks the
// remote segment's rights refuse end at once with xfer.ErrPermission.
// Tasks the rdma transport does not take because it closed or has no
// queue pair up go to tcp.
func (l *rdmaLink) Submit(tasks []*xfer.Task) (int, error) {
	done := 0
	for done < len(tasks) {
		i := done
		route := l.classify(tasks[i])
		for i++; i < len(tasks) && l.classify(tasks[i]) == route; i++ {
		}
		var n int
		var err error
		switch route {
		case viaNotify:
			n, err = l.submitNotified(tasks[done])
		case viaTCP:
			n, err = l.tcp.Submit(tasks[done:i])
			l.p.stats.toTCP.Add(uint64(n))
		case viaDown:
			n, err = l.p.linkDown.Submit(tasks[done:i])
		case viaRefuse:
			l.p.stats.refused.Add(uint64(i - done))
			for _, t := range tasks[done:i] {
				t.Done(0, fmt.Errorf("%w: %s/%s opened with rights %v", xfer.ErrPermission, l.peer, t.Target.(*tcp.Remote).Name(), t.Target.(*tcp.Remote).Rights()))
			}
			n = i - done
		default:
			// Count before handing them over: a dispatched task may end,
			// and be reused, before Submit returns; those it did not
			// dispatch are still the caller's.
			b := lengths(tasks[done:i])
			n, err = l.tr.Submit(tasks[done:i])
			l.p.stats.posted(n, b-lengths(tasks[done+n:i]))
			if err != nil && (errors.Is(err, xfer.ErrClosed) || errors.Is(err, rdma.ErrQPDown)) {
				// The link was retired under us, or none of its queue
				// pairs is up: what it did not take goes to tcp.
				var m int
				m, err = l.fallback(tasks[done+n : i])
				n += m
			}
		}
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

const (
	viaRDMA = iota
	viaTCP
	viaRefuse
	viaNotify
	viaDown // opened with transport rdma, which cannot carry it now
)

// fallback sends to tcp what the rdma transport did not take, except the
// tasks of segments opened with transport rdma, which fail.
func (l *rdmaLink) fallback(ts []*xfer.Task) (int, error) {
	done := 0
	for done < len(ts) {
		i := done
		for i < len(ts) && !l.rdmaOnly(ts[i]) {
			i++
		}
		if i > done {
			n, err := l.tcp.Submit(ts[done:i])
			done += n
			if err != nil {
				return done, err
			}
			continue
		}
		n, _ := l.p.linkDown.Submit(ts[done : done+1])
		done += n
	}
	return done, nil
}

// rdmaOnly reports whether t's target was opened with transport rdma.
func (l *rdmaLink) rdmaOnly(t *xfer.Task) bool {
	r, ok := t.Target.(*tcp.Remote)
	return ok && pinned(r) == wire.TransportRDMA
}

// classify picks where one task goes. The keys of both sides ride on the
// task's segments (xfer.SlotRDMA): the owner's, which this link resolved,
// on the target; the links' own registration on the local side.
func (l *rdmaLink) classify(t *xfer.Task) int {
	r, ok := t.Target.(*tcp.Remote)
	if !ok {
		return viaTCP
	}
	need := tcp.RightRead
	if t.Req.Op == xfer.OpWrite {
		need = tcp.RightWrite
	}
	if r.Rights()&need == 0 {
		return viaRefuse
	}
	if k := rdma.KeysOf(r); k == nil || k.Owner() != any(l) {
		if l.rdmaOnly(t) {
			return viaDown
		}
		return viaTCP // not resolved, or revoked by its owner
	}
	if l.p.localKeys(t.Local) == nil {
		if l.rdmaOnly(t) {
			return viaDown
		}
		return viaTCP // a client buffer whose registration went away
	}
	if t.Notify != nil {
		return viaNotify
	}
	return viaRDMA
}

// addKeys records the owner's keys k of r, which resolve put in r's slot.
// False when the link was retired meanwhile (k is then not set).
func (l *rdmaLink) addKeys(r *tcp.Remote, k *rdma.Keys) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.segs == nil {
		return false
	}
	l.segs[r] = k
	return true
}

// forgetKeys is r's teardown releasing the keys k this link put on it.
func (l *rdmaLink) forgetKeys(r *tcp.Remote, k *rdma.Keys) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.segs[r] == k {
		delete(l.segs, r)
	}
}

// dropKeys takes the link's keys back from every segment it resolved: the
// link is retired or closing, and their requests go to tcp (or a new
// link) from now on. Later resolutions on the link record nothing.
func (l *rdmaLink) dropKeys() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for r, k := range l.segs {
		r.Regs().Drop(xfer.SlotRDMA, k)
	}
	l.segs = nil
}

// resolved is how many remote segments the link resolved (Info).
func (l *rdmaLink) resolved() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.segs)
}
