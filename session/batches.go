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
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// waitSlice bounds one engine wait so a closing server is noticed.
const waitSlice = 250 * time.Millisecond

// timeoutGrace is how long a one-shot Transfer waits past its deadline for
// the engine to end what is still live in Timeout; clients allow for it.
const timeoutGrace = wire.TimeoutGrace

// AllocBatch allocates a batch for the session.
func (s *Session) AllocBatch(m *wire.AllocBatchRequest, r *wire.Response) error {
	lim := &s.h.Limits
	if m.Capacity == 0 || int(m.Capacity) > lim.MaxBatchCapacity {
		return fmt.Errorf("%w: batch capacity %d (max %d)", ErrLimit, m.Capacity, lim.MaxBatchCapacity)
	}
	if len(s.batches) >= lim.MaxBatches {
		return fmt.Errorf("%w: %d batches held", ErrLimit, lim.MaxBatches)
	}
	id, err := s.h.Engine.AllocateBatch(int(m.Capacity))
	if err != nil {
		return err
	}
	s.batches[id] = struct{}{}
	wire.SetResponse[wire.AllocBatchResponse](r).Batch = uint64(id)
	return nil
}

func (s *Session) ownBatch(batch uint64) (BatchID, error) {
	id := BatchID(batch)
	if _, ok := s.batches[id]; !ok {
		return 0, fmt.Errorf("%w: batch %d", ErrNotFound, id)
	}
	return id, nil
}

// stageRequests copies reqs into s.reqs for the engine, each checked by
// checkRequest: a refused request gets its code in s.codes (OK for the
// others) and is replaced in s.reqs by its standIn, so that the engine
// refuses it in its place and positions stay aligned. s.errs is cleared
// for the engine's results.
func (s *Session) stageRequests(reqs []xfer.Request) {
	n := len(reqs)
	s.reqs = append(s.reqs[:0], reqs...)
	s.codes = slices.Grow(s.codes[:0], n)[:n]
	s.errs = slices.Grow(s.errs[:0], n)[:n]
	for i := range s.reqs {
		s.errs[i] = nil
		code := s.checkRequest(&s.reqs[i])
		s.codes[i] = code
		if code != tcproto.CodeOK {
			s.reqs[i] = standIn(s.reqs[i])
		}
	}
}

// checkRequest says whether this connection may make q: both its sides
// (local first) pass mayTouch, and its op is a read or a write
// (INVALID_ARGUMENT).
func (s *Session) checkRequest(q *xfer.Request) Code {
	code := s.mayTouch(q.Local, q.LocalOffset, q.Length)
	if code == tcproto.CodeOK {
		code = s.mayTouch(q.Target, q.TargetOffset, q.Length)
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
func (s *Session) mayTouch(id xfer.SegmentID, off, n uint64) Code {
	if n == 0 {
		return tcproto.CodeINVALID_ARGUMENT
	}
	if s.pool != nil && id == s.pool.ID() {
		if !s.blocks.covers(off, n) {
			return tcproto.CodePERMISSION_DENIED
		}
		return tcproto.CodeOK
	}
	seg, ok := s.Resolve(id)
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

func (s *Session) submitOpts(ctx *wire.Context) SubmitOptions {
	var d time.Time
	if ctx.DeadlineMS > 0 {
		d = time.Now().Add(time.Duration(ctx.DeadlineMS) * time.Millisecond)
	}
	return SubmitOptions{Deadline: d, Resolver: s}
}

// Submit submits requests to one of the session's batches.
func (s *Session) Submit(ctx *wire.Context, m *wire.SubmitRequest, r *wire.Response) error {
	id, err := s.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	if len(m.Requests) > s.h.Limits.MaxRequests {
		return fmt.Errorf("%w: %d requests (max %d)", ErrLimit, len(m.Requests), s.h.Limits.MaxRequests)
	}
	s.stageRequests(m.Requests)
	opts := s.submitOpts(ctx)
	opts.Notify = s.notifyArgs(m.Notify)
	if err := s.h.Engine.Submit(id, s.reqs, opts, s.errs); err != nil {
		return err
	}
	for i := range s.codes {
		if s.codes[i] == tcproto.CodeOK {
			s.codes[i] = CodeOf(s.errs[i])
		}
	}
	wire.SetResponse[wire.SubmitResponse](r).Codes = s.codes
	return nil
}

// TaskStatus reports one task of one of the session's batches.
func (s *Session) TaskStatus(m *wire.TaskStatusRequest, r *wire.Response) error {
	id, err := s.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	st, err := s.h.Engine.Status(id, int(m.Index))
	if err != nil {
		return err
	}
	code := tcproto.CodeOK
	if st.State.Terminal() {
		code = s.taskCode(st.State, st.Err)
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
func (s *Session) BatchStatus(m *wire.BatchStatusRequest, r *wire.Response) error {
	id, err := s.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	sum, err := s.h.Engine.BatchStatus(id)
	if err != nil {
		return err
	}
	wire.SetResponse[wire.BatchStatusResponse](r).Summary = summaryFrom(sum)
	return nil
}

// wait waits for batch id until deadline, in slices so a closing server
// is noticed. Running out of time is not an error: the summary says what is
// still live.
func (s *Session) wait(id BatchID, deadline time.Time, closing <-chan struct{}) (BatchSummary, error) {
	e := s.h.Engine
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
	}
}

// Wait waits for one of the session's batches.
func (s *Session) Wait(ctx *wire.Context, m *wire.WaitRequest, r *wire.Response) error {
	id, err := s.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	sum, err := s.wait(id, s.deadline(ctx, m.TimeoutMS), s.h.Closing)
	if err != nil {
		return err
	}
	wire.SetResponse[wire.WaitResponse](r).Summary = summaryFrom(sum)
	return nil
}

// FreeBatch frees one of the session's batches.
func (s *Session) FreeBatch(m *wire.FreeBatchRequest, r *wire.Response) error {
	id, err := s.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	if err := s.h.Engine.Free(id); err != nil {
		return err
	}
	delete(s.batches, id)
	wire.SetResponse[wire.FreeBatchResponse](r)
	return nil
}

// Transfer is the one-shot call: allocate a batch, submit, wait, free.
func (s *Session) Transfer(ctx *wire.Context, m *wire.TransferRequestBody, r *wire.Response) error {
	n := len(m.Requests)
	if n > s.h.Limits.MaxBatchCapacity {
		return fmt.Errorf("%w: %d requests (max %d)", ErrLimit, n, s.h.Limits.MaxBatchCapacity)
	}
	e := s.h.Engine
	id, err := e.AllocateBatch(n)
	if err != nil {
		return err
	}
	s.batches[id] = struct{}{} // released on close should anything below fail hard
	deadline := s.deadline(ctx, m.TimeoutMS)
	s.stageRequests(m.Requests)
	err = e.Submit(id, s.reqs, SubmitOptions{Deadline: deadline, Resolver: s, Notify: s.notifyArgs(m.Notify)}, s.errs)
	if err != nil {
		s.dropBatch(id)
		return err
	}
	// The engine's deadline timer ends live tasks in Timeout at deadline;
	// waiting a little past it lets the answer say Timeout, not Pending.
	sum, err := s.wait(id, deadline.Add(timeoutGrace), s.h.Closing)
	if err != nil {
		s.dropBatch(id)
		return err
	}
	s.sts = slices.Grow(s.sts[:0], n)[:n]
	states := s.sts
	for i := range s.codes {
		if s.codes[i] != tcproto.CodeOK {
			states[i] = tcproto.TaskStateINVALID
			continue
		}
		if s.errs[i] != nil {
			s.codes[i] = CodeOf(s.errs[i])
			states[i] = tcproto.TaskStateINVALID
			continue
		}
		st, err := e.Status(id, i)
		if err != nil {
			s.codes[i] = CodeOf(err)
			continue
		}
		states[i] = tcproto.TaskState(st.State)
		s.codes[i] = s.taskCode(st.State, st.Err)
	}
	s.dropBatch(id)
	*wire.SetResponse[wire.TransferResponse](r) = wire.TransferResponse{Codes: s.codes, States: states, Summary: summaryFrom(sum)}
	return nil
}

// dropBatch frees a batch the server allocated itself, abandoning it when
// tasks are still live (the engine then frees it once they end).
func (s *Session) dropBatch(id BatchID) {
	e := s.h.Engine
	if err := e.Free(id); err != nil {
		if errors.Is(err, ErrBatchBusy) {
			e.Abandon(id)
		} else {
			s.log.Warn("freeing a batch failed", "batch", id, "err", err)
		}
	}
	delete(s.batches, id)
}
