package link

import (
	"errors"
	"fmt"

	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
)

// Notified WRITEs over RDMA. The bytes move by RDMA WRITE; once its
// completion says they were placed in the owner's memory, the notification
// goes on the peer channel in the tcp node's own notification frame
// (tcp.Node.Notify), as a notified WRITE's over tcp does, and the owner
// delivers it to the export's subscribers before answering. The task
// completes only on that answer: the same fail-closed contract as on tcp
// (a refusal fails the task with tcp.ErrNotifyRejected, no answer by the
// deadline with xfer.ErrTimeout, a lost session with its error). A failed
// WRITE sends no notification.
//
// The owner still serves notifications sent as an exchange
// (notifyExchange), which daemons of the previous release send.

const notifyExchange = "rdma.notify"

// notifyReq is the exchange body: u8 name length, name, payload.
func notifyReq(name string, payload []byte) []byte {
	b := make([]byte, 0, 1+len(name)+len(payload))
	b = append(b, byte(len(name)))
	b = append(b, name...)
	return append(b, payload...)
}

// parseNotify decodes an exchange body a peer sent (notifyReq's): the
// export's name and the payload, which aliases req; xfer.ErrInvalid when
// it is truncated or the payload is over tcp.MaxNotify.
func parseNotify(req []byte) (name string, payload []byte, err error) {
	if len(req) < 1 || len(req) < 1+int(req[0]) {
		return "", nil, fmt.Errorf("%w: notification of %d bytes", xfer.ErrInvalid, len(req))
	}
	name, payload = string(req[1:1+int(req[0])]), req[1+int(req[0]):]
	if len(payload) > tcp.MaxNotify {
		return "", nil, fmt.Errorf("%w: notification of %d bytes (max %d)", xfer.ErrInvalid, len(payload), tcp.MaxNotify)
	}
	return name, payload, nil
}

// serveNotify delivers a peer's notification for one of this daemon's
// exports of the default tenant (the daemons that send it this way are
// of a release before tenants), which must grant the peer write access
// (a notification rides a WRITE).
func (p *Links) serveNotify(from string, _ uint64, req []byte) ([]byte, error) {
	name, payload, err := parseNotify(req)
	if err != nil {
		return nil, err
	}
	x := p.exported.Get(peer.DefaultTenant, name)
	if x == nil || tcp.Rights(x.Rights())&tcp.RightWrite == 0 {
		return nil, fmt.Errorf("%w: %q is not exported for writing", xfer.ErrPermission, name)
	}
	if err := x.Deliver(payload); err != nil {
		return nil, err
	}
	return nil, nil
}

// rdmaNote stands in front of a notified task's Completer from its post
// on the link until it ends. The rdma transport carries no notification (a
// task with Notify set is refused there), so the link takes it off the
// task for the WRITE's flight; once the WRITE completed, the note puts it
// back and hands the task to the tcp node, which sends only the
// notification (tcp.Node.Notify) and ends the task on the owner's answer.
// Notes are reused (Links.note): the path starts no goroutine and, warm,
// allocates nothing.
type rdmaNote struct {
	l       *rdmaLink
	orig    xfer.Completer
	payload []byte
	sent    bool          // the WRITE completed: the notification is out
	one     [1]*xfer.Task // the submission, without a slice to allocate
}

// TaskDone implements xfer.Completer. It runs twice: on the WRITE's
// reaper when it ends (the reactor worker that posted it, or the queue
// pair's goroutine; see rdma's "Who reaps"), and again when the notification's answer ends the
// task (on the tcp node's goroutines, or within Notify).
func (n *rdmaNote) TaskDone(t *xfer.Task, moved uint64, err error) {
	l := n.l
	if !n.sent && err == nil {
		n.sent = true
		t.Notify = n.payload
		l.tcp.Notify(t, moved)
		return
	}
	if n.sent {
		if err == nil {
			l.p.stats.notified.Add(1)
		} else {
			l.p.stats.notifyFail.Add(1)
		}
	}
	if err != nil {
		moved = 0 // a failed WRITE or notification fails its task whole
	}
	orig := n.orig
	t.SetCompleter(orig)
	t.Notify = n.payload
	l.p.putNote(n)
	t.Done(moved, err)
}

// note is a reset note for a task of link l.
func (p *Links) note(l *rdmaLink) *rdmaNote {
	p.notesMu.Lock()
	var n *rdmaNote
	if k := len(p.notes); k > 0 {
		n = p.notes[k-1]
		p.notes = p.notes[:k-1]
	}
	p.notesMu.Unlock()
	if n == nil {
		n = new(rdmaNote)
	}
	n.l = l
	return n
}

// putNote takes a note back once its task ended.
func (p *Links) putNote(n *rdmaNote) {
	*n = rdmaNote{}
	p.notesMu.Lock()
	p.notes = append(p.notes, n)
	p.notesMu.Unlock()
}

// submitNotified posts one notified WRITE on the link. A task the link does
// not take gets its notification back and goes to tcp, which carries it
// itself.
func (l *rdmaLink) submitNotified(t *xfer.Task) (int, error) {
	note := l.p.note(l)
	note.orig, note.payload = t.Completer(), t.Notify
	note.one[0] = t
	t.Notify = nil
	t.SetCompleter(note)
	n, err := l.tr.Submit(note.one[:])
	if n == 1 {
		return 1, nil
	}
	t.SetCompleter(note.orig)
	t.Notify = note.payload
	l.p.putNote(note)
	if errors.Is(err, xfer.ErrClosed) || errors.Is(err, rdma.ErrQPDown) {
		return l.fallback([]*xfer.Task{t})
	}
	return 0, err
}
