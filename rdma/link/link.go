package link

// The link: the transport one peer's remote targets get when RDMA carries
// them, and how it splits a submission between the rdma transport, the
// peer channel (notified writes) and tcp.

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

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
	// segs maps the remote segments the link resolved to their owner's
	// registration of them (copy on write, under mu).
	segs atomic.Pointer[map[*tcp.Remote]rdma.RemoteRegion]
	// ids are the request segment ids the transport has tables for (copy
	// on write, under mu).
	ids atomic.Pointer[map[xfer.SegmentID]struct{}]
	mu  sync.Mutex
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
	if l.p.pins.n.Load() == 0 {
		return l.tcp.Submit(ts)
	}
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
	return ok && l.p.pinned(r) == wire.TransportRDMA
}

// classify picks where one task goes, adding the rdma transport's tables
// for its segment ids the first time they are seen.
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
	reg, ok := (*l.segs.Load())[r]
	if !ok {
		if l.rdmaOnly(t) {
			return viaDown
		}
		return viaTCP // not resolved, or revoked by its owner
	}
	via := viaRDMA
	if t.Notify != nil {
		via = viaNotify
	}
	ids := *l.ids.Load()
	_, lok := ids[t.Req.Local]
	_, tok := ids[t.Req.Target]
	if lok && tok {
		return via
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := (*l.segs.Load())[r]; !ok {
		return viaTCP
	}
	if err := l.tr.AddRemote(t.Req.Target, reg); err != nil {
		return viaTCP
	}
	lr := l.p.localRegion(t.Local)
	if lr == nil {
		if l.rdmaOnly(t) {
			return viaDown
		}
		return viaTCP // a client buffer whose registration went away
	}
	l.tr.AddLocal(t.Req.Local, lr)
	m := maps.Clone(*l.ids.Load())
	m[t.Req.Local], m[t.Req.Target] = struct{}{}, struct{}{}
	l.ids.Store(&m)
	return via
}
