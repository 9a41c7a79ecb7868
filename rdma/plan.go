package rdma

import (
	"fmt"

	"github.com/tensorcast/tensorcast/xfer"
)

// Work-request opcodes as the verbs layer posts them.
const (
	opWrite uint8 = 1 // IBV_WR_RDMA_WRITE
	opRead  uint8 = 2 // IBV_WR_RDMA_READ
)

// planTask appends the work requests of one task to out: the request split
// wherever the local or the remote registration changes chunk or the
// length exceeds maxMsg. It returns out unchanged and an error wrapping
// xfer.ErrInvalid or ErrNotRegistered when the task cannot be planned,
// among them a task of more than maxWRs work requests (a send queue's
// size: such a task can never be posted). It stops planning there: the
// remote table's chunks are the peer's, and planning runs under the queue
// pair's lock.
func planTask(out []WorkRequest, t *xfer.Task, local, remote *keyTable, maxMsg uint64, maxWRs int) ([]WorkRequest, error) {
	r := &t.Req
	var op uint8
	switch r.Op {
	case xfer.OpWrite:
		op = opWrite
	case xfer.OpRead:
		op = opRead
	default:
		return out, fmt.Errorf("%w: op %d", xfer.ErrInvalid, r.Op)
	}
	if r.Length == 0 {
		return out, fmt.Errorf("%w: zero length", xfer.ErrInvalid)
	}
	start := len(out)
	loff, roff, left := r.LocalOffset, r.TargetOffset, r.Length
	for left > 0 {
		if len(out)-start >= maxWRs {
			return out[:start], fmt.Errorf("%w: %d bytes need more than %d work requests; a send queue holds %d",
				xfer.ErrInvalid, r.Length, maxWRs, maxWRs)
		}
		laddr, lkey, _, lspan, ok := local.lookup(loff, left)
		if !ok {
			return out[:start], fmt.Errorf("%w: local range %d+%d of segment %d", ErrNotRegistered, r.LocalOffset, r.Length, r.Local)
		}
		raddr, _, rkey, rspan, ok := remote.lookup(roff, left)
		if !ok {
			return out[:start], fmt.Errorf("%w: target range %d+%d of segment %d", ErrNotRegistered, r.TargetOffset, r.Length, r.Target)
		}
		n := min(lspan, rspan, maxMsg)
		out = append(out, WorkRequest{
			laddr: laddr, raddr: raddr, length: uint32(n),
			lkey: lkey, rkey: rkey, op: op,
		})
		loff += n
		roff += n
		left -= n
	}
	return out, nil
}

// markSignals sets which work requests of one posted list ask for a
// completion: every nth and the last. An unsignalled request is retired by
// the next signalled completion after it (RC queues complete in order).
// It returns how many are signalled.
func markSignals(wrs []WorkRequest, every int) int {
	every = max(every, 1)
	n := 0
	for i := range wrs {
		if (i+1)%every == 0 || i == len(wrs)-1 {
			wrs[i].signaled = 1
			n++
		} else {
			wrs[i].signaled = 0
		}
	}
	return n
}
