package session

// The handlers of batches and transfers: AllocBatch, Submit, TaskStatus,
// BatchStatus, Wait, FreeBatch and the one-shot Transfer, with the checks
// every request passes before the engine sees it.

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// waitSlice bounds one engine wait so a closing server is noticed.
const waitSlice = 250 * time.Millisecond

// timeoutGrace is how long a one-shot Transfer waits past its deadline for
// the engine to end what is still live in Timeout; clients allow for it.
const timeoutGrace = wire.TimeoutGrace

// AllocBatch allocates a batch for the session.
func (c *Session) AllocBatch(m *wire.AllocBatchRequest, r *wire.Response) error {
	lim := &c.h.Limits
	if m.Capacity == 0 || int(m.Capacity) > lim.MaxBatchCapacity {
		return fmt.Errorf("%w: batch capacity %d (max %d)", ErrLimit, m.Capacity, lim.MaxBatchCapacity)
	}
	if len(c.batches) >= lim.MaxBatches {
		return fmt.Errorf("%w: %d batches held", ErrLimit, lim.MaxBatches)
	}
	id, err := c.h.Engine.AllocateBatch(int(m.Capacity))
	if err != nil {
		return err
	}
	c.batches[id] = struct{}{}
	wire.SetResponse[wire.AllocBatchResponse](r).Batch = uint64(id)
	return nil
}

func (c *Session) ownBatch(batch uint64) (BatchID, error) {
	id := BatchID(batch)
	if _, ok := c.batches[id]; !ok {
		return 0, fmt.Errorf("%w: batch %d", ErrNotFound, id)
	}
	return id, nil
}

// stageRequests copies reqs into s.reqs for the engine, each checked by
// checkRequest: a refused request gets its code in s.codes (OK for the
// others) and is replaced in s.reqs by its standIn, so that the engine
// refuses it in its place and positions stay aligned. s.errs is cleared
// for the engine's results.
func (c *Session) stageRequests(reqs []xfer.Request) {
	n := len(reqs)
	c.reqs = append(c.reqs[:0], reqs...)
	c.codes = slices.Grow(c.codes[:0], n)[:n]
	c.errs = slices.Grow(c.errs[:0], n)[:n]
	for i := range c.reqs {
		c.errs[i] = nil
		code := c.checkRequest(&c.reqs[i])
		c.codes[i] = code
		if code != tcproto.CodeOK {
			c.reqs[i] = standIn(c.reqs[i])
		}
	}
}

// checkRequest says whether this connection may make q: both its sides
// (local first) pass mayTouch, and its op is a read or a write
// (INVALID_ARGUMENT).
func (c *Session) checkRequest(q *xfer.Request) Code {
	code := c.mayTouch(q.Local, q.LocalOffset, q.Length)
	if code == tcproto.CodeOK {
		code = c.mayTouch(q.Target, q.TargetOffset, q.Length)
	}
	if code == tcproto.CodeOK && q.Op != xfer.OpRead && q.Op != xfer.OpWrite {
		code = tcproto.CodeINVALID_ARGUMENT
	}
	return code
}

// mayTouch checks n bytes at off of segment id: n is not zero
// (INVALID_ARGUMENT); in the pool, they lie within the connection's own
// blocks (PERMISSION_DENIED); any other segment is one the connection can
// resolve (NOT_FOUND), and they lie within it (INVALID_ARGUMENT).
func (c *Session) mayTouch(id xfer.SegmentID, off, n uint64) Code {
	if n == 0 {
		return tcproto.CodeINVALID_ARGUMENT
	}
	if c.pool != nil && id == c.pool.ID() {
		if !c.blocks.Covers(off, n) {
			return tcproto.CodePERMISSION_DENIED
		}
		return tcproto.CodeOK
	}
	seg, ok := c.Resolve(id)
	if !ok {
		return tcproto.CodeNOT_FOUND
	}
	if end := off + n; end < off || end > seg.Size() {
		return tcproto.CodeINVALID_ARGUMENT
	}
	return tcproto.CodeOK
}

// standIn is what the engine is given in place of a refused request q: a
// request naming segment 0, which no resolver knows, so that the engine
// refuses it at q's position without touching anything.
func standIn(q xfer.Request) xfer.Request { return xfer.Request{Op: q.Op} }

func (c *Session) submitOpts(ctx *wire.Context) SubmitOptions {
	var d time.Time
	if ctx.DeadlineMS > 0 {
		d = time.Now().Add(time.Duration(ctx.DeadlineMS) * time.Millisecond)
	}
	return SubmitOptions{Deadline: d, Resolver: c}
}

// Submit submits requests to one of the session's batches.
func (c *Session) Submit(ctx *wire.Context, m *wire.SubmitRequest, r *wire.Response) error {
	id, err := c.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	if len(m.Requests) > c.h.Limits.MaxRequests {
		return fmt.Errorf("%w: %d requests (max %d)", ErrLimit, len(m.Requests), c.h.Limits.MaxRequests)
	}
	c.stageRequests(m.Requests)
	opts := c.submitOpts(ctx)
	opts.Notify = c.notifyArgs(m.Notify)
	if err := c.h.Engine.Submit(id, c.reqs, opts, c.errs); err != nil {
		return err
	}
	for i := range c.codes {
		if c.codes[i] == tcproto.CodeOK {
			c.codes[i] = status.CodeOf(c.errs[i])
		}
	}
	wire.SetResponse[wire.SubmitResponse](r).Codes = c.codes
	return nil
}

// TaskStatus reports one task of one of the session's batches.
func (c *Session) TaskStatus(m *wire.TaskStatusRequest, r *wire.Response) error {
	id, err := c.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	st, err := c.h.Engine.Status(id, int(m.Index))
	if err != nil {
		return err
	}
	code := tcproto.CodeOK
	if st.State.Terminal() {
		code = status.ForState(st.State, st.Err)
	}
	*wire.SetResponse[wire.TaskStatusResponse](r) = wire.TaskStatusResponse{
		State: tcproto.TaskState(st.State), Transferred: st.Transferred, Code: code}
	return nil
}

func summaryFrom(b BatchSummary) wire.Summary {
	return wire.Summary{Total: uint32(b.Total), Waiting: uint32(b.Waiting), Pending: uint32(b.Pending),
		Completed: uint32(b.Completed), Failed: uint32(b.Failed), Timeout: uint32(b.Timeout), Canceled: uint32(b.Canceled),
		Transferred: b.Transferred}
}

// BatchStatus reports one of the session's batches.
func (c *Session) BatchStatus(m *wire.BatchStatusRequest, r *wire.Response) error {
	id, err := c.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	sum, err := c.h.Engine.BatchStatus(id)
	if err != nil {
		return err
	}
	wire.SetResponse[wire.BatchStatusResponse](r).Summary = summaryFrom(sum)
	return nil
}

// wait waits for batch id until deadline, in slices so a closing server
// is noticed, and, for a handler's wait (call), a client that hung up.
// Running out of time is not an error: the summary says what is still
// live.
func (c *Session) wait(id BatchID, deadline time.Time, closing <-chan struct{}, call bool) (BatchSummary, error) {
	e := c.h.Engine
	for {
		step := deadline
		if t := time.Now().Add(waitSlice); t.Before(step) {
			step = t
		}
		sum, err := e.Wait(id, step)
		if err != nil && !errors.Is(err, xfer.ErrTimeout) {
			return sum, err
		}
		if err == nil && sum.Waiting+sum.Pending == 0 {
			return sum, nil
		}
		if !time.Now().Before(deadline) {
			return e.BatchStatus(id)
		}
		select {
		case <-closing:
			return sum, fmt.Errorf("%w: server closing", ErrUnavailable)
		default:
		}
		if call && c.clientGone() {
			return sum, errClientGone
		}
	}
}

// Wait waits for one of the session's batches.
func (c *Session) Wait(ctx *wire.Context, m *wire.WaitRequest, r *wire.Response) error {
	id, err := c.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	sum, err := c.wait(id, c.deadline(ctx, m.TimeoutMS), c.h.Closing, true)
	if err != nil {
		return err
	}
	wire.SetResponse[wire.WaitResponse](r).Summary = summaryFrom(sum)
	return nil
}

// FreeBatch frees one of the session's batches.
func (c *Session) FreeBatch(m *wire.FreeBatchRequest, r *wire.Response) error {
	id, err := c.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	if err := c.h.Engine.Free(id); err != nil {
		return err
	}
	delete(c.batches, id)
	wire.SetResponse[wire.FreeBatchResponse](r)
	return nil
}

// Transfer is the one-shot call: allocate a batch, submit, wait, free.
func (c *Session) Transfer(ctx *wire.Context, m *wire.TransferRequestBody, r *wire.Response) error {
	n := len(m.Requests)
	if n > c.h.Limits.MaxBatchCapacity {
		return fmt.Errorf("%w: %d requests (max %d)", ErrLimit, n, c.h.Limits.MaxBatchCapacity)
	}
	e := c.h.Engine
	id, err := e.AllocateBatch(n)
	if err != nil {
		return err
	}
	c.batches[id] = struct{}{} // released on close should anything below fail hard
	deadline := c.deadline(ctx, m.TimeoutMS)
	c.stageRequests(m.Requests)
	err = e.Submit(id, c.reqs, SubmitOptions{Deadline: deadline, Resolver: c, Notify: c.notifyArgs(m.Notify)}, c.errs)
	if err != nil {
		c.dropBatch(id)
		return err
	}
	// The engine's deadline timer ends live tasks in Timeout at deadline;
	// waiting a little past it lets the answer say Timeout, not Pending.
	sum, err := c.wait(id, deadline.Add(timeoutGrace), c.h.Closing, true)
	if err != nil {
		c.dropBatch(id)
		return err
	}
	c.sts = slices.Grow(c.sts[:0], n)[:n]
	states := c.sts
	for i := range c.codes {
		if c.codes[i] != tcproto.CodeOK {
			states[i] = tcproto.TaskStateINVALID
			continue
		}
		if c.errs[i] != nil {
			c.codes[i] = status.CodeOf(c.errs[i])
			states[i] = tcproto.TaskStateINVALID
			continue
		}
		st, err := e.Status(id, i)
		if err != nil {
			c.codes[i] = status.CodeOf(err)
			continue
		}
		states[i] = tcproto.TaskState(st.State)
		c.codes[i] = status.ForState(st.State, st.Err)
	}
	c.dropBatch(id)
	*wire.SetResponse[wire.TransferResponse](r) = wire.TransferResponse{Codes: c.codes, States: states, Summary: summaryFrom(sum)}
	return nil
}

// dropBatch frees a batch the server allocated itself, abandoning it when
// tasks are still live (the engine then frees it once they end).
func (c *Session) dropBatch(id BatchID) {
	e := c.h.Engine
	if err := e.Free(id); err != nil {
		if errors.Is(err, ErrBatchBusy) {
			e.Abandon(id)
		} else {
			c.log.Warn("freeing a batch failed", "batch", id, "err", err)
		}
	}
	delete(c.batches, id)
}
