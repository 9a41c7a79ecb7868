package grant

import (
	"time"

	"github.com/tensorcast/tensorcast/store"
)

// Clock is the time source of claims, handles, leases and budgets: the
// store's (Now and AfterFunc), so that tests inject one clock they advance
// by hand and the daemon the wall clock.
type Clock = store.Clock

// wallClock is the wall clock (with its monotonic reading).
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) AfterFunc(d time.Duration, f func()) store.Timer { return time.AfterFunc(d, f) }

// sched keeps the deadlines of one table: a min-heap of (at, id, ver)
// records and one timer armed for the earliest. A record whose id has gone
// or changed version since is stale; the owner recognizes it when it pops
// (renewals and releases leave their old records behind). Its methods are
// called with the owner's mutex held; the timer calls fire, which takes
// that mutex itself.
type sched struct {
	clock Clock
	fire  func()
	heap  []deadline
	timer store.Timer
	armed time.Time // when timer fires; zero when none is armed
}

type deadline struct {
	at  time.Time
	id  uint64
	ver uint32
}

// add records that id (at version ver) ends at at, and arms the timer if
// at is now the earliest deadline.
func (s *sched) add(at time.Time, id uint64, ver uint32) {
	s.heap = append(s.heap, deadline{at, id, ver})
	q := s.heap
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q[i].at.Before(q[p].at) {
			break
		}
		q[p], q[i] = q[i], q[p]
		i = p
	}
	s.arm()
}

// tidy drops the records keep refuses when stale ones outnumber the live
// (there are more than twice live plus 64): releases and renewals leave
// their records behind, and a busy table must not keep one per call until
// its deadline. The heap is rebuilt in place.
func (s *sched) tidy(live int, keep func(deadline) bool) {
	if len(s.heap) <= 2*live+64 {
		return
	}
	q := s.heap[:0]
	for _, d := range s.heap {
		if keep(d) {
			q = append(q, d)
		}
	}
	clear(s.heap[len(q):])
	s.heap = q
	for i := len(q)/2 - 1; i >= 0; i-- {
		s.down(i)
	}
}

// due pops and returns (into dst) the records whose time has come by now.
func (s *sched) due(now time.Time, dst []deadline) []deadline {
	for len(s.heap) > 0 && !s.heap[0].at.After(now) {
		dst = append(dst, s.pop())
	}
	return dst
}

func (s *sched) pop() deadline {
	q := s.heap
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	s.heap = q[:last]
	s.down(0)
	return top
}

// down sifts the record at i down to its place.
func (s *sched) down(i int) {
	q := s.heap
	for {
		l, m := 2*i+1, i
		if l < len(q) && q[l].at.Before(q[m].at) {
			m = l
		}
		if r := l + 1; r < len(q) && q[r].at.Before(q[m].at) {
			m = r
		}
		if m == i {
			return
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
}

// arm sets the timer for the earliest deadline, unless one already fires
// at or before it. After a fire the owner calls arm again (armed is then
// zero).
func (s *sched) arm() {
	if len(s.heap) == 0 || s.fire == nil {
		return
	}
	at := s.heap[0].at
	if !s.armed.IsZero() && !s.armed.After(at) {
		return
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	s.armed = at
	s.timer = s.clock.AfterFunc(at.Sub(s.clock.Now()), s.fire)
}

// fired is called by the owner's fire, under its mutex, before it pops:
// no timer is armed any more.
func (s *sched) fired() { s.armed, s.timer = time.Time{}, nil }

// stop disarms the timer and forgets every deadline (Close).
func (s *sched) stop() {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.timer, s.armed, s.heap = nil, time.Time{}, nil
}
