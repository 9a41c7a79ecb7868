package peer

import (
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/wire"
)

// Inbox is one subscriber's bounded queue of notifications (a control
// connection's): Exports.Deliver fills it, its owner drains it with Take
// and sleeps in Wait until a notification is queued.
type Inbox struct {
	name  string
	limit int
	// wake has room for one token: put leaves one when it queues, Wait
	// takes it.
	wake chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	q  []wire.Notification
	// reserved are places a Deliver holds while it checks its other
	// subscribers, so that it queues everywhere or nowhere.
	reserved int
	subs     map[*Export]struct{}
	closed   bool
}

// NewInbox returns an empty inbox that holds up to limit notifications;
// name says whose it is in errors ("connection 7").
func NewInbox(name string, limit int) *Inbox {
	return &Inbox{name: name, limit: limit, wake: make(chan struct{}, 1), subs: map[*Export]struct{}{}}
}

// reserve holds a place for one notification; false when the inbox is
// full or closed.
func (in *Inbox) reserve() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed || len(in.q)+in.reserved >= in.limit {
		return false
	}
	in.reserved++
	return true
}

// unreserve gives a place back.
func (in *Inbox) unreserve() {
	in.mu.Lock()
	in.reserved--
	in.mu.Unlock()
}

// put queues n in the place reserve held and wakes a Wait.
func (in *Inbox) put(n wire.Notification) {
	in.mu.Lock()
	in.reserved--
	if !in.closed {
		in.q = append(in.q, n)
	}
	in.mu.Unlock()
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

// add records a subscription; false once the inbox is closed.
func (in *Inbox) add(e *Export) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return false
	}
	in.subs[e] = struct{}{}
	return true
}

// forget drops the subscription to e, which ended.
func (in *Inbox) forget(e *Export) {
	in.mu.Lock()
	delete(in.subs, e)
	in.mu.Unlock()
}

// Take moves up to max queued notifications to dst, oldest first: the
// first whatever its size, the others while their sizes fit in budget
// bytes (a notification counts its segment name, its payload and 32).
func (in *Inbox) Take(dst []wire.Notification, max, budget int) []wire.Notification {
	in.mu.Lock()
	defer in.mu.Unlock()
	k := 0
	for k < len(in.q) && k < max {
		sz := len(in.q[k].Segment) + len(in.q[k].Payload) + 32
		if k > 0 && sz > budget {
			break
		}
		budget -= sz
		k++
	}
	dst = append(dst, in.q[:k]...)
	clear(in.q[:k])
	in.q = in.q[k:]
	if len(in.q) == 0 {
		in.q = nil
	}
	return dst
}

// Wait sleeps until a notification is queued (true), deadline passes or
// stop is closed (false). A notification queued since the last Wait
// returns at once; one queued before that may make Wait return with the
// queue empty again, so callers Take and Wait in a loop.
func (in *Inbox) Wait(deadline time.Time, stop <-chan struct{}) bool {
	d := time.Until(deadline)
	if d <= 0 {
		return false
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-in.wake:
		return true
	case <-timer.C:
	case <-stop:
	}
	return false
}

// Len is how many notifications are queued.
func (in *Inbox) Len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.q)
}

// Subscriptions is how many exports deliver to the inbox.
func (in *Inbox) Subscriptions() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.subs)
}

// Close unsubscribes from every export and drops what is queued; later
// Subscribe calls fail.
func (in *Inbox) Close() {
	in.mu.Lock()
	subs := in.subs
	in.subs = map[*Export]struct{}{}
	in.q = nil
	in.closed = true
	in.mu.Unlock()
	for e := range subs {
		e.mu.Lock()
		if e.subs != nil {
			delete(e.subs, in)
		}
		e.mu.Unlock()
	}
}
