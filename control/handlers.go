package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// waitSlice bounds one engine wait so a closing server is noticed.
const waitSlice = 250 * time.Millisecond

// timeoutGrace is how long a one-shot Transfer waits past its deadline for
// the engine to end what is still live in Timeout.
const timeoutGrace = 100 * time.Millisecond

// mutating reports whether a request changes what the connection holds or
// moves data; those are audited and idempotent by key.
func mutating(k Kind) bool {
	switch k {
	case tcproto.RequestBodyRegisterBufferRequest, tcproto.RequestBodyUnregisterBufferRequest,
		tcproto.RequestBodyAllocBlocksRequest, tcproto.RequestBodyFreeBlocksRequest,
		tcproto.RequestBodyAllocBatchRequest, tcproto.RequestBodySubmitRequest,
		tcproto.RequestBodyFreeBatchRequest, tcproto.RequestBodyTransferRequestBody,
		tcproto.RequestBodyRegisterFileRequest, tcproto.RequestBodyExportSegmentRequest,
		tcproto.RequestBodyUnexportSegmentRequest, tcproto.RequestBodyOpenRemoteRequest,
		tcproto.RequestBodyCloseRemoteRequest, tcproto.RequestBodySubscribeRequest:
		return true
	}
	return false
}

// dataPath reports whether a mutating request is one of the per-transfer
// calls that are audited below AuditLevel.
func dataPath(k Kind) bool {
	switch k {
	case tcproto.RequestBodySubmitRequest, tcproto.RequestBodyTransferRequestBody,
		tcproto.RequestBodyAllocBlocksRequest, tcproto.RequestBodyFreeBlocksRequest,
		tcproto.RequestBodyAllocBatchRequest, tcproto.RequestBodyFreeBatchRequest:
		return true
	}
	return false
}

// handle serves c.req and returns the answer frame and the fd to pass with
// it (-1 for none).
func (c *conn) handle() ([]byte, int) {
	m := &c.req
	if m.Kind != tcproto.RequestBodyRegisterBufferRequest && len(c.fds) > 0 {
		closeFDs(c.fds)
		c.fds = c.fds[:0]
		c.log.Warn("file descriptor with a request that takes none", "kind", m.Kind.String(), "request_id", m.Ctx.RequestID)
		return c.errorFrame(ErrUnexpectedFD), -1
	}
	mut := mutating(m.Kind)
	keyed := mut && len(m.Ctx.IdempotencyKey) > 0
	var h uint64
	if keyed {
		h = argsHash(m)
		if e, ok := c.idem.get(m.Ctx.IdempotencyKey); ok {
			closeFDs(c.fds)
			c.fds = c.fds[:0]
			if e.hash != h {
				c.audit(m, tcproto.CodeFAILED_PRECONDITION, true)
				return c.errorFrame(ErrIdempotencyConflict), -1
			}
			c.audit(m, tcproto.CodeOK, true)
			out := slices.Clone(e.frame)
			tcproto.GetRootAsResponse(out[FrameHeader:], 0).MutateRequestId(m.Ctx.RequestID)
			return out, -1
		}
	}

	c.resp = Response{RequestID: m.Ctx.RequestID}
	fd := -1
	var err error
	switch m.Kind {
	case tcproto.RequestBodyHelloRequest:
		c.hello()
	case tcproto.RequestBodyPingRequest:
		c.resp.Kind = tcproto.ResponseBodyPingResponse
		c.resp.Payload = m.Payload
	case tcproto.RequestBodyRegisterBufferRequest:
		err = c.registerBuffer()
	case tcproto.RequestBodyUnregisterBufferRequest:
		err = c.unregister()
	case tcproto.RequestBodyPoolInfoRequest:
		fd = c.poolInfo()
	case tcproto.RequestBodyAllocBlocksRequest:
		err = c.allocBlocks()
	case tcproto.RequestBodyFreeBlocksRequest:
		c.freeBlocks()
	case tcproto.RequestBodyAllocBatchRequest:
		err = c.allocBatch()
	case tcproto.RequestBodySubmitRequest:
		err = c.submit()
	case tcproto.RequestBodyTaskStatusRequest:
		err = c.taskStatus()
	case tcproto.RequestBodyBatchStatusRequest:
		err = c.batchStatus()
	case tcproto.RequestBodyWaitRequest:
		err = c.waitBatch()
	case tcproto.RequestBodyFreeBatchRequest:
		err = c.freeBatch()
	case tcproto.RequestBodyTransferRequestBody:
		err = c.transfer()
	case tcproto.RequestBodyStatsRequest:
		c.stats()
	case tcproto.RequestBodyRegisterFileRequest:
		err = c.registerFile()
	case tcproto.RequestBodyExportSegmentRequest:
		err = c.exportSegment()
	case tcproto.RequestBodyUnexportSegmentRequest:
		err = c.unexportSegment()
	case tcproto.RequestBodyOpenRemoteRequest:
		err = c.openRemote()
	case tcproto.RequestBodyCloseRemoteRequest:
		err = c.closeRemote()
	case tcproto.RequestBodySubscribeRequest:
		err = c.subscribe()
	case tcproto.RequestBodyPollNotificationsRequest:
		err = c.pollNotifications()
	case tcproto.RequestBodyPeersRequest:
		err = c.peers()
	case tcproto.RequestBodySegmentsRequest:
		c.segmentsList()
	case tcproto.RequestBodyRdmaRequest:
		c.rdmaInfo()
	default:
		err = fmt.Errorf("%w: request body %d", ErrMalformed, m.Kind)
	}
	closeFDs(c.fds) // a handler that takes its fd leaves none
	c.fds = c.fds[:0]
	code := tcproto.CodeOK
	if err != nil {
		code = CodeOf(err)
		lvl := slog.LevelDebug
		if code == tcproto.CodeINTERNAL {
			lvl = slog.LevelError
		}
		c.log.Log(context.Background(), lvl, "request failed", "kind", m.Kind.String(),
			"request_id", m.Ctx.RequestID, "code", code.String(), "err", err)
		c.resp = Response{RequestID: m.Ctx.RequestID, Status: code, Message: []byte(message(code))}
	}
	out := EncodeResponse(c.b, &c.resp)
	if mut {
		c.audit(m, code, false)
	}
	if keyed && code != tcproto.CodeUNAVAILABLE && code != tcproto.CodeINTERNAL {
		c.idem.put(m.Ctx.IdempotencyKey, idemEntry{hash: h, frame: slices.Clone(out)}, c.s.cfg.Limits.MaxIdempotencyKeys)
	}
	return out, fd
}

// audit records a mutating call with the audit keys.
func (c *conn) audit(m *Request, code Code, replay bool) {
	lvl := c.s.cfg.AuditLevel
	if dataPath(m.Kind) {
		lvl -= 4
	}
	if !c.log.Enabled(context.Background(), lvl) {
		return
	}
	c.log.LogAttrs(context.Background(), lvl, "audit",
		slog.Uint64("request_id", m.Ctx.RequestID),
		slog.String("idempotency_key", string(m.Ctx.IdempotencyKey)),
		slog.String("lane", string(m.Ctx.Lane)),
		slog.Uint64("policy_version", uint64(m.Ctx.PolicyVersion)),
		slog.String("op", m.Kind.String()),
		slog.String("code", code.String()),
		slog.Bool("replay", replay))
}

func (c *conn) deadline(timeoutMS uint32) time.Time {
	switch {
	case timeoutMS > 0:
		return time.Now().Add(time.Duration(timeoutMS) * time.Millisecond)
	case c.req.Ctx.DeadlineMS > 0:
		return time.Now().Add(time.Duration(c.req.Ctx.DeadlineMS) * time.Millisecond)
	}
	return time.Now().Add(c.s.cfg.DefaultWait)
}

func (c *conn) hello() {
	l := &c.s.cfg.Limits
	c.resp.Kind = tcproto.ResponseBodyHelloResponse
	c.resp.ProtocolVersion = ProtocolVersion
	c.resp.DaemonID = []byte(c.s.cfg.DaemonID)
	c.resp.Version = []byte(c.s.cfg.Version)
	c.resp.PeerAddr = []byte(c.s.cfg.PeerAddr)
	c.resp.Limits = LimitsInfo{
		MaxFrame: uint32(c.s.cfg.MaxFrame), MaxBuffers: uint32(l.MaxBuffers), MaxBlocks: uint32(l.MaxBlocks),
		MaxBatches: uint32(l.MaxBatches), MaxBatchCapacity: uint32(l.MaxBatchCapacity),
		MaxRequests: uint32(l.MaxRequests), MaxIdempotencyKeys: uint32(l.MaxIdempotencyKeys),
	}
	c.log.Debug("hello", "client", string(c.req.Name), "protocol_version", c.req.ProtocolVersion)
}

func (c *conn) segments() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.buffers) + len(c.files)
}

func (c *conn) registerBuffer() error {
	fd, err := c.takeFD()
	if err != nil {
		return err
	}
	lim := &c.s.cfg.Limits
	if c.req.Size == 0 || c.req.Size > lim.MaxBufferSize {
		closeFDs([]int{fd})
		return fmt.Errorf("%w: buffer of %d bytes (max %d)", ErrLimit, c.req.Size, lim.MaxBufferSize)
	}
	if c.segments() >= lim.MaxBuffers {
		closeFDs([]int{fd})
		return fmt.Errorf("%w: %d segments held", ErrLimit, lim.MaxBuffers)
	}
	reg := c.s.deps.Registry
	id := reg.NextID()
	buf, err := c.s.deps.MapBuffer(id, fd, c.req.Size, lim.MaxBufferSize)
	if err != nil {
		return err
	}
	if err := reg.Add(buf); err != nil {
		buf.Close()
		return err
	}
	c.mu.Lock()
	c.buffers[id] = buf
	c.mu.Unlock()
	c.resp.Kind = tcproto.ResponseBodyRegisterBufferResponse
	c.resp.Segment = uint64(id)
	return nil
}

func (c *conn) registerFile() error {
	op := c.s.deps.FileOpener
	if op == nil {
		return fmt.Errorf("%w: no file opener configured", ErrUnavailable)
	}
	if c.segments() >= c.s.cfg.Limits.MaxBuffers {
		return fmt.Errorf("%w: %d segments held", ErrLimit, c.s.cfg.Limits.MaxBuffers)
	}
	reg := c.s.deps.Registry
	id := reg.NextID()
	f, err := op.OpenFile(id, string(c.req.Name), c.req.Direct, c.req.Size)
	if err != nil {
		return err
	}
	if err := reg.Add(f); err != nil {
		f.Close()
		return err
	}
	c.mu.Lock()
	c.files[id] = f
	c.mu.Unlock()
	c.resp.Kind = tcproto.ResponseBodyRegisterFileResponse
	c.resp.Segment = uint64(id)
	c.resp.Size = f.Size()
	return nil
}

func (c *conn) unregister() error {
	id := xfer.SegmentID(c.req.Segment)
	c.mu.Lock()
	b, isBuf := c.buffers[id]
	f, isFile := c.files[id]
	delete(c.buffers, id)
	delete(c.files, id)
	c.mu.Unlock()
	if !isBuf && !isFile {
		return fmt.Errorf("%w: segment %d", ErrNotFound, id)
	}
	c.dropExportsOf(id)
	c.s.deps.Registry.Remove(id)
	c.resp.Kind = tcproto.ResponseBodyUnregisterBufferResponse
	if isBuf {
		return b.Close()
	}
	return f.Close()
}

func (c *conn) poolInfo() int {
	p := c.s.deps.Pool
	c.resp.Kind = tcproto.ResponseBodyPoolInfoResponse
	c.resp.Segment = uint64(p.ID())
	c.resp.Size = p.Size()
	c.resp.BlockClasses = blockClasses(p)
	return p.Fd()
}

func (c *conn) allocBlocks() error {
	n := int(c.req.N)
	if n == 0 || c.req.Size == 0 {
		return fmt.Errorf("%w: %d blocks of %d bytes", ErrMalformed, n, c.req.Size)
	}
	if c.blocks.len()+n > c.s.cfg.Limits.MaxBlocks {
		return fmt.Errorf("%w: %d blocks held, %d asked (max %d)", ErrLimit, c.blocks.len(), n, c.s.cfg.Limits.MaxBlocks)
	}
	c.offs = slices.Grow(c.offs[:0], n)[:n]
	offs := c.offs
	p := c.s.deps.Pool
	if err := p.AllocN(c.req.Size, offs); err != nil {
		return err
	}
	for _, off := range offs {
		size, ok := p.BlockSize(off)
		if !ok {
			size = c.req.Size
		}
		c.blocks.add(off, size)
	}
	c.resp.Kind = tcproto.ResponseBodyAllocBlocksResponse
	c.resp.Offsets = offs
	return nil
}

func (c *conn) freeBlocks() {
	c.codes = c.codes[:0]
	p := c.s.deps.Pool
	for _, off := range c.req.Offsets {
		i, held := slices.BinarySearch(c.blocks.offs, off)
		if !held {
			c.codes = append(c.codes, tcproto.CodeNOT_FOUND)
			continue
		}
		if c.exported(p.ID(), off, c.blocks.sizes[i]) {
			// Peers may be writing into it: unexport first.
			c.codes = append(c.codes, tcproto.CodeFAILED_PRECONDITION)
			continue
		}
		if c.pview.busy(off) {
			// A transfer of this connection still moves bytes in it
			// (possibly past its deadline): free it once that ends.
			c.codes = append(c.codes, tcproto.CodeBUSY)
			continue
		}
		err := p.Free(off)
		if err == nil {
			c.blocks.remove(off)
		}
		c.codes = append(c.codes, CodeOf(err))
	}
	c.resp.Kind = tcproto.ResponseBodyFreeBlocksResponse
	c.resp.Codes = c.codes
}

func (c *conn) allocBatch() error {
	lim := &c.s.cfg.Limits
	if c.req.Capacity == 0 || int(c.req.Capacity) > lim.MaxBatchCapacity {
		return fmt.Errorf("%w: batch capacity %d (max %d)", ErrLimit, c.req.Capacity, lim.MaxBatchCapacity)
	}
	if len(c.batches) >= lim.MaxBatches {
		return fmt.Errorf("%w: %d batches held", ErrLimit, lim.MaxBatches)
	}
	id, err := c.s.deps.Engine.AllocateBatch(int(c.req.Capacity))
	if err != nil {
		return err
	}
	c.batches[id] = struct{}{}
	c.resp.Kind = tcproto.ResponseBodyAllocBatchResponse
	c.resp.Batch = uint64(id)
	return nil
}

func (c *conn) ownBatch() (BatchID, error) {
	id := BatchID(c.req.Batch)
	if _, ok := c.batches[id]; !ok {
		return 0, fmt.Errorf("%w: batch %d", ErrNotFound, id)
	}
	return id, nil
}

// scope checks that every request names only segments this connection may
// touch, within bounds. A refused request gets its code in c.codes and is
// replaced in c.reqs by one naming segment 0, which no resolver knows, so
// the engine refuses it in its place and positions stay aligned.
func (c *conn) scope(reqs []xfer.Request) (refused int) {
	n := len(reqs)
	c.reqs = append(c.reqs[:0], reqs...)
	c.codes = slices.Grow(c.codes[:0], n)[:n]
	c.errs = slices.Grow(c.errs[:0], n)[:n]
	for i := range c.reqs {
		c.errs[i] = nil
		code := c.checkSide(c.reqs[i].Local, c.reqs[i].LocalOffset, c.reqs[i].Length)
		if code == tcproto.CodeOK {
			code = c.checkSide(c.reqs[i].Target, c.reqs[i].TargetOffset, c.reqs[i].Length)
		}
		if code == tcproto.CodeOK && c.reqs[i].Op != xfer.OpRead && c.reqs[i].Op != xfer.OpWrite {
			code = tcproto.CodeINVALID_ARGUMENT
		}
		c.codes[i] = code
		if code != tcproto.CodeOK {
			c.reqs[i] = xfer.Request{Op: c.reqs[i].Op}
			refused++
		}
	}
	return refused
}

func (c *conn) checkSide(id xfer.SegmentID, off, n uint64) Code {
	if n == 0 {
		return tcproto.CodeINVALID_ARGUMENT
	}
	if id == c.s.deps.Pool.ID() {
		if !c.blocks.covers(off, n) {
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

func (c *conn) submitOpts() SubmitOptions {
	var d time.Time
	if c.req.Ctx.DeadlineMS > 0 {
		d = time.Now().Add(time.Duration(c.req.Ctx.DeadlineMS) * time.Millisecond)
	}
	return SubmitOptions{Deadline: d, Resolver: c}
}

func (c *conn) submit() error {
	id, err := c.ownBatch()
	if err != nil {
		return err
	}
	if len(c.req.Requests) > c.s.cfg.Limits.MaxRequests {
		return fmt.Errorf("%w: %d requests (max %d)", ErrLimit, len(c.req.Requests), c.s.cfg.Limits.MaxRequests)
	}
	c.scope(c.req.Requests)
	opts := c.submitOpts()
	opts.Notify = c.notifyArgs()
	if err := c.s.deps.Engine.Submit(id, c.reqs, opts, c.errs); err != nil {
		return err
	}
	for i := range c.codes {
		if c.codes[i] == tcproto.CodeOK {
			c.codes[i] = CodeOf(c.errs[i])
		}
	}
	c.resp.Kind = tcproto.ResponseBodySubmitResponse
	c.resp.Codes = c.codes
	return nil
}

func (c *conn) taskStatus() error {
	id, err := c.ownBatch()
	if err != nil {
		return err
	}
	st, err := c.s.deps.Engine.Status(id, int(c.req.Index))
	if err != nil {
		return err
	}
	code := tcproto.CodeOK
	if st.State.Terminal() {
		code = c.taskCode(st.State, st.Err)
	}
	c.resp.Kind = tcproto.ResponseBodyTaskStatusResponse
	c.resp.Task = TaskInfo{State: tcproto.TaskState(st.State), Transferred: st.Transferred, Code: code}
	return nil
}

func summaryFrom(s BatchSummary) Summary {
	return Summary{uint32(s.Total), uint32(s.Waiting), uint32(s.Pending), uint32(s.Completed),
		uint32(s.Failed), uint32(s.Timeout), uint32(s.Canceled), s.Transferred}
}

func (c *conn) batchStatus() error {
	id, err := c.ownBatch()
	if err != nil {
		return err
	}
	s, err := c.s.deps.Engine.BatchStatus(id)
	if err != nil {
		return err
	}
	c.resp.Kind = tcproto.ResponseBodyBatchStatusResponse
	c.resp.Summary = summaryFrom(s)
	return nil
}

// wait waits for batch id until deadline, in slices so a closing server
// is noticed. Running out of time is not an error: the summary says what is
// still live.
func (c *conn) wait(id BatchID, deadline time.Time, closing <-chan struct{}) (BatchSummary, error) {
	e := c.s.deps.Engine
	for {
		step := deadline
		if s := time.Now().Add(waitSlice); s.Before(step) {
			step = s
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

func (c *conn) waitBatch() error {
	id, err := c.ownBatch()
	if err != nil {
		return err
	}
	s, err := c.wait(id, c.deadline(c.req.TimeoutMS), c.s.closing)
	if err != nil {
		return err
	}
	c.resp.Kind = tcproto.ResponseBodyWaitResponse
	c.resp.Summary = summaryFrom(s)
	return nil
}

func (c *conn) freeBatch() error {
	id, err := c.ownBatch()
	if err != nil {
		return err
	}
	if err := c.s.deps.Engine.Free(id); err != nil {
		return err
	}
	delete(c.batches, id)
	c.resp.Kind = tcproto.ResponseBodyFreeBatchResponse
	return nil
}

// transfer is the one-shot call: allocate a batch, submit, wait, free.
func (c *conn) transfer() error {
	n := len(c.req.Requests)
	if n > c.s.cfg.Limits.MaxBatchCapacity {
		return fmt.Errorf("%w: %d requests (max %d)", ErrLimit, n, c.s.cfg.Limits.MaxBatchCapacity)
	}
	e := c.s.deps.Engine
	id, err := e.AllocateBatch(n)
	if err != nil {
		return err
	}
	c.batches[id] = struct{}{} // released on close should anything below fail hard
	deadline := c.deadline(c.req.TimeoutMS)
	c.scope(c.req.Requests)
	err = e.Submit(id, c.reqs, SubmitOptions{Deadline: deadline, Resolver: c, Notify: c.notifyArgs()}, c.errs)
	if err != nil {
		c.dropBatch(id)
		return err
	}
	// The engine's deadline timer ends live tasks in Timeout at deadline;
	// waiting a little past it lets the answer say Timeout, not Pending.
	sum, err := c.wait(id, deadline.Add(timeoutGrace), c.s.closing)
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
			c.codes[i] = CodeOf(c.errs[i])
			states[i] = tcproto.TaskStateINVALID
			continue
		}
		st, err := e.Status(id, i)
		if err != nil {
			c.codes[i] = CodeOf(err)
			continue
		}
		states[i] = tcproto.TaskState(st.State)
		c.codes[i] = c.taskCode(st.State, st.Err)
	}
	c.dropBatch(id)
	c.resp.Kind = tcproto.ResponseBodyTransferResponse
	c.resp.Codes = c.codes
	c.resp.States = states
	c.resp.Summary = summaryFrom(sum)
	return nil
}

// dropBatch frees a batch the server allocated itself, abandoning it when
// tasks are still live (the engine then frees it once they end).
func (c *conn) dropBatch(id BatchID) {
	e := c.s.deps.Engine
	if err := e.Free(id); err != nil {
		if errors.Is(err, ErrBatchBusy) {
			e.Abandon(id)
		} else {
			c.log.Warn("freeing a batch failed", "batch", id, "err", err)
		}
	}
	delete(c.batches, id)
}

func (c *conn) stats() {
	c.resp.Kind = tcproto.ResponseBodyStatsResponse
	c.resp.Pool = statsCounters(c.s.deps.Pool, c.resp.Pool[:0])
	c.resp.Engine = statsCounters(c.s.deps.Engine, c.resp.Engine[:0])
	c.resp.Connections = uint32(c.s.Connections())
	c.resp.Transports = c.resp.Transports[:0]
	if f := c.s.deps.TransportStats; f != nil {
		c.resp.Transports = f(c.resp.Transports)
	}
	c.resp.Conn = append(c.resp.Conn[:0],
		Counter{"segments", uint64(c.segments())},
		Counter{"blocks", uint64(c.blocks.len())},
		Counter{"batches", uint64(len(c.batches))},
		Counter{"idempotency_keys", uint64(len(c.idem.order))},
		Counter{"exports", uint64(len(c.exports))},
		Counter{"remotes", uint64(c.remoteCount())},
		Counter{"notifications_queued", uint64(c.queuedNotes())},
	)
}

// release frees everything the connection holds, whatever state it is in:
// stray fds, batches (abandoning those still busy after ReleaseWait, or at
// once when the server closes: a drain gave them their time already),
// registered segments and pool blocks.
func (c *conn) release() {
	c.releasePeers()
	for _, g := range c.groups {
		closeFDs(g.fds)
	}
	c.groups = nil
	closeFDs(c.fds)
	c.fds = nil
	e := c.s.deps.Engine
	deadline := time.Now().Add(c.s.cfg.ReleaseWait)
	for id := range c.batches {
		err := e.Free(id)
		if errors.Is(err, ErrBatchBusy) {
			if !c.s.isClosing() {
				c.wait(id, deadline, c.s.closing) //nolint:errcheck // Free below says how it ended
			}
			err = e.Free(id)
			if errors.Is(err, ErrBatchBusy) {
				c.log.Warn("abandoning a busy batch of a closed connection", "batch", id)
				e.Abandon(id)
				err = nil
			}
		}
		if err != nil {
			c.log.Warn("freeing a batch of a closed connection failed", "batch", id, "err", err)
		}
	}
	clear(c.batches)
	c.mu.Lock()
	bufs, files := c.buffers, c.files
	c.buffers, c.files = map[xfer.SegmentID]Buffer{}, map[xfer.SegmentID]FileSegment{}
	c.mu.Unlock()
	reg := c.s.deps.Registry
	for id, b := range bufs {
		reg.Remove(id)
		if err := b.Close(); err != nil {
			c.log.Warn("closing a buffer of a closed connection failed", "segment", id, "err", err)
		}
	}
	for id, f := range files {
		reg.Remove(id)
		if err := f.Close(); err != nil {
			c.log.Warn("closing a file of a closed connection failed", "segment", id, "err", err)
		}
	}
	p := c.s.deps.Pool
	exported := func(i int) bool { return c.exported(p.ID(), c.blocks.offs[i], c.blocks.sizes[i]) }
	inFlight := c.pview.close(func(off uint64) bool {
		i, _ := slices.BinarySearch(c.blocks.offs, off)
		return !exported(i)
	})
	for i, off := range c.blocks.offs {
		switch {
		case exported(i):
			// A peer request stalled inside it past ReleaseWait; handing
			// the block to another client could let its bytes land there.
			c.log.Error("leaving a pool block allocated: a peer request still holds it", "offset", off)
		case inFlight[off]:
			// A transfer abandoned with the connection still moves bytes
			// in it; the last one to end frees it.
			c.log.Warn("pool block left to its in-flight transfers; freed when they end", "offset", off)
		default:
			if err := p.Free(off); err != nil {
				c.log.Warn("freeing a pool block of a closed connection failed", "offset", off, "err", err)
			}
		}
	}
	c.blocks = blockSet{}
	c.log.Debug("connection resources released")
}
