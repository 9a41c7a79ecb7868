package link

import (
	"errors"
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
)

// Notified WRITEs over RDMA. The bytes move by RDMA WRITE; once its
// completion says they were placed in the owner's memory, the notification
// goes on the peer channel as an exchange, and the owner delivers it to the
// export's subscribers before answering. The task completes only on that
// answer: the same fail-closed contract as on tcp (a refusal fails the task
// with tcp.ErrNotifyRejected, no answer by the deadline with
// xfer.ErrTimeout, a lost session with its error). A failed WRITE sends no
// notification.

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
// exports, which must grant the peer write access (a notification rides a
// WRITE).
func (p *Links) serveNotify(from string, _ uint64, req []byte) ([]byte, error) {
	name, payload, err := parseNotify(req)
	if err != nil {
		return nil, err
	}
	if r, ok := p.exported.Granted(name); !ok || tcp.Rights(r)&tcp.RightWrite == 0 {
		return nil, fmt.Errorf("%w: %q is not exported for writing", xfer.ErrPermission, name)
	}
	if err := p.exported.Deliver(name, payload); err != nil {
		return nil, err
	}
	return nil, nil
}

// rdmaNote stands in front of a notified task's Completer while its WRITE
// is posted on the link. It holds the task's notification meanwhile: the
// rdma transport carries none (a task with Notify set is refused there),
// so the link takes it off the task for the WRITE's flight and puts it
// back before the task ends.
type rdmaNote struct {
	l        *rdmaLink
	orig     xfer.Completer
	name     string
	payload  []byte
	deadline time.Time
}

// TaskDone implements xfer.Completer. It runs on the transport's poller,
// so the exchange runs on its own goroutine.
func (n *rdmaNote) TaskDone(t *xfer.Task, moved uint64, err error) {
	t.SetCompleter(n.orig)
	t.Notify = n.payload
	if err != nil {
		t.Done(0, err)
		return
	}
	go func() {
		wait := time.Until(n.deadline)
		if wait <= 0 {
			t.Done(0, fmt.Errorf("%w: the notification's deadline passed during the WRITE", xfer.ErrTimeout))
			return
		}
		p := n.l.p
		_, err := p.node.ExchangeAt(n.l.peer, n.l.epoch, notifyExchange, notifyReq(n.name, n.payload), wait)
		if err == nil {
			p.stats.notified.Add(1)
		} else {
			p.stats.notifyFail.Add(1)
		}
		switch {
		case err == nil:
			t.Done(moved, nil)
		case errors.Is(err, tcp.ErrExchange):
			t.Done(0, fmt.Errorf("%w: %v", tcp.ErrNotifyRejected, err))
		default:
			t.Done(0, err)
		}
	}()
}

// submitNotified posts one notified WRITE on the link. A task the link does
// not take gets its notification back and goes to tcp, which carries it
// itself.
func (l *rdmaLink) submitNotified(t *xfer.Task) (int, error) {
	r := t.Target.(*tcp.Remote)
	deadline := t.Deadline
	if deadline.IsZero() {
		deadline = time.Now().Add(xfer.DefaultTimeout)
	}
	note := &rdmaNote{l: l, orig: t.Completer(), name: r.Name(), payload: t.Notify, deadline: deadline}
	t.Notify = nil
	t.SetCompleter(note)
	n, err := l.tr.Submit([]*xfer.Task{t})
	if n == 1 {
		return 1, nil
	}
	t.SetCompleter(note.orig)
	t.Notify = note.payload
	if errors.Is(err, xfer.ErrClosed) || errors.Is(err, rdma.ErrQPDown) {
		return l.fallback([]*xfer.Task{t})
	}
	return 0, err
}
