package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"syscall"
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

// mutating reports whether a request changes what the connection holds or
// moves data; those are audited and idempotent by key.
func mutating(k wire.RequestKind) bool {
	switch k {
	case tcproto.RequestBodyRegisterBufferRequest, tcproto.RequestBodyUnregisterBufferRequest,
		tcproto.RequestBodyAllocBlocksRequest, tcproto.RequestBodyFreeBlocksRequest,
		tcproto.RequestBodyAllocBatchRequest, tcproto.RequestBodySubmitRequest,
		tcproto.RequestBodyFreeBatchRequest, tcproto.RequestBodyTransferRequestBody,
		tcproto.RequestBodyRegisterFileRequest, tcproto.RequestBodyExportSegmentRequest,
		tcproto.RequestBodyUnexportSegmentRequest, tcproto.RequestBodyOpenRemoteRequest,
		tcproto.RequestBodyCloseRemoteRequest, tcproto.RequestBodySubscribeRequest,
		tcproto.RequestBodyOpenQueueRequest, tcproto.RequestBodyCloseQueueRequest,
		tcproto.RequestBodyStorePutRequest, tcproto.RequestBodyStoreRemoveRequest, tcproto.RequestBodyStorePinRequest,
		tcproto.RequestBodyStoreUnpinRequest, tcproto.RequestBodyStoreReserveRequest, tcproto.RequestBodyStoreCommitRequest,
		tcproto.RequestBodyStoreAbortRequest:
		return true
	}
	return false
}

// dataPath reports whether a mutating request is one of the per-transfer
// calls that are audited below AuditLevel.
func dataPath(k wire.RequestKind) bool {
	switch k {
	case tcproto.RequestBodySubmitRequest, tcproto.RequestBodyTransferRequestBody,
		tcproto.RequestBodyAllocBlocksRequest, tcproto.RequestBodyFreeBlocksRequest,
		tcproto.RequestBodyAllocBatchRequest, tcproto.RequestBodyFreeBatchRequest,
		tcproto.RequestBodyStorePutRequest, tcproto.RequestBodyStorePinRequest, tcproto.RequestBodyStoreUnpinRequest,
		tcproto.RequestBodyStoreReserveRequest, tcproto.RequestBodyStoreCommitRequest, tcproto.RequestBodyStoreAbortRequest:
		return true
	}
	return false
}

// handle serves c.req and returns the answer frame and the fd to pass with
// it (-1 for none).
func (c *conn) handle() ([]byte, int) {
	m := &c.req
	kind := m.Kind()
	if c.fdsLost {
		closeFDs(c.fds)
		c.fds, c.fdsLost = c.fds[:0], false
		c.log.Warn("file descriptors sent with a request were lost: the daemon is out of file descriptors",
			"kind", kind.String(), "request_id", m.Ctx.RequestID)
		return c.errorFrame(fmt.Errorf("%w: file descriptor not received", syscall.EMFILE)), -1
	}
	if _, takesFD := m.Body.(*wire.RegisterBufferRequest); !takesFD && len(c.fds) > 0 {
		closeFDs(c.fds)
		c.fds = c.fds[:0]
		c.log.Warn("file descriptor with a request that takes none", "kind", kind.String(), "request_id", m.Ctx.RequestID)
		return c.errorFrame(ErrUnexpectedFD), -1
	}
	mut := mutating(kind)
	keyed := mut && len(m.Ctx.IdempotencyKey) > 0 && kind != tcproto.RequestBodyOpenQueueRequest
	var h uint64
	if keyed {
		h = argsHash(c.b, m)
		if frame, err := c.idemLookup(m, h); frame != nil || err != nil {
			closeFDs(c.fds)
			c.fds = c.fds[:0]
			if err != nil {
				c.audit(m, tcproto.CodeFAILED_PRECONDITION, true)
				return c.errorFrame(err), -1
			}
			c.audit(m, tcproto.CodeOK, true)
			return c.idemReplay(frame), -1
		}
	}

	c.resp.Reset(m.Ctx.RequestID)
	fd := -1
	var err error
	switch b := m.Body.(type) {
	case *wire.HelloRequest:
		c.hello(b)
	case *wire.PingRequest:
		wire.SetResponse[wire.PingResponse](&c.resp).Payload = b.Payload
	case *wire.RegisterBufferRequest:
		err = c.registerBuffer(b)
	case *wire.UnregisterBufferRequest:
		err = c.unregister(b)
	case *wire.PoolInfoRequest:
		fd, err = c.poolInfo()
	case *wire.AllocBlocksRequest:
		err = c.allocBlocks(b)
	case *wire.FreeBlocksRequest:
		c.freeBlocks(b)
	case *wire.AllocBatchRequest:
		err = c.allocBatch(b)
	case *wire.SubmitRequest:
		err = c.submit(b)
	case *wire.TaskStatusRequest:
		err = c.taskStatus(b)
	case *wire.BatchStatusRequest:
		err = c.batchStatus(b)
	case *wire.WaitRequest:
		err = c.waitBatch(b)
	case *wire.FreeBatchRequest:
		err = c.freeBatch(b)
	case *wire.TransferRequestBody:
		err = c.transfer(b)
	case *wire.StatsRequest:
		c.stats()
	case *wire.RegisterFileRequest:
		err = c.registerFile(b)
	case *wire.ExportSegmentRequest:
		err = c.exportSegment(b)
	case *wire.UnexportSegmentRequest:
		err = c.unexportSegment(b)
	case *wire.OpenRemoteRequest:
		err = c.openRemote(b)
	case *wire.CloseRemoteRequest:
		err = c.closeRemote(b)
	case *wire.SubscribeRequest:
		err = c.subscribe(b)
	case *wire.PollNotificationsRequest:
		err = c.pollNotifications(b)
	case *wire.PeersRequest:
		err = c.peers()
	case *wire.SegmentsRequest:
		c.segmentsList()
	case *wire.RDMARequest:
		c.rdmaInfo()
	case *wire.DirectoryRequest:
		err = c.directoryReport()
	case *wire.OpenQueueRequest:
		fd, err = c.openQueue(b)
	case *wire.CloseQueueRequest:
		err = c.closeQueue(b)
	case *wire.StorePutRequest:
		err = c.storePut(b)
	case *wire.StoreReadRequest:
		err = c.storeRead(b)
	case *wire.StoreRemoveRequest:
		err = c.storeRemove(b)
	case *wire.StorePinRequest:
		err = c.storePin(b)
	case *wire.StoreUnpinRequest:
		err = c.storeUnpin(b)
	case *wire.StoreReserveRequest:
		err = c.storeReserve(b)
	case *wire.StoreCommitRequest:
		err = c.storeCommit(b)
	case *wire.StoreAbortRequest:
		err = c.storeAbort(b)
	case *wire.StoreStatRequest:
		err = c.storeStat(b)
	case *wire.StoreListRequest:
		err = c.storeList(b)
	case *wire.StoreFlushRequest:
		err = c.storeFlush(b)
	default:
		err = fmt.Errorf("%w: request body %s is not served", ErrMalformed, kind)
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
		c.log.Log(context.Background(), lvl, "request failed", "kind", kind.String(),
			"request_id", m.Ctx.RequestID, "code", code.String(), "err", err)
		c.fail(m.Ctx.RequestID, code)
	}
	out := wire.EncodeResponse(c.b, &c.resp)
	if mut {
		c.audit(m, code, false)
	}
	if keyed && code != tcproto.CodeUNAVAILABLE && code != tcproto.CodeINTERNAL {
		c.idemRecord(m, h, out)
	}
	return out, fd
}

// audit records a mutating call with the audit keys.
func (c *conn) audit(m *wire.Request, code Code, replay bool) {
	lvl := c.s.cfg.AuditLevel
	if dataPath(m.Kind()) {
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
		slog.String("op", m.Kind().String()),
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

func (c *conn) hello(m *wire.HelloRequest) {
	l := &c.s.cfg.Limits
	r := wire.SetResponse[wire.HelloResponse](&c.resp)
	r.ProtocolVersion = wire.ProtocolVersion
	r.DaemonID = []byte(c.s.cfg.DaemonID)
	r.Version = []byte(c.s.cfg.Version)
	r.PeerAddr = []byte(c.s.cfg.PeerAddr)
	r.Limits = wire.LimitsInfo{
		MaxFrame: uint32(c.s.cfg.MaxFrame), MaxBuffers: uint32(l.MaxBuffers), MaxBlocks: uint32(l.MaxBlocks),
		MaxBatches: uint32(l.MaxBatches), MaxBatchCapacity: uint32(l.MaxBatchCapacity),
		MaxRequests: uint32(l.MaxRequests), MaxIdempotencyKeys: uint32(l.MaxIdempotencyKeys),
	}
	c.log.Debug("hello", "client", string(m.ClientName), "protocol_version", m.ProtocolVersion)
}

func (c *conn) segments() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.buffers) + len(c.files)
}

func (c *conn) registerBuffer(m *wire.RegisterBufferRequest) error {
	fd, err := c.takeFD()
	if err != nil {
		return err
	}
	lim := &c.s.cfg.Limits
	if m.Size == 0 || m.Size > lim.MaxBufferSize {
		closeFDs([]int{fd})
		return fmt.Errorf("%w: buffer of %d bytes (max %d)", ErrLimit, m.Size, lim.MaxBufferSize)
	}
	if c.segments() >= lim.MaxBuffers {
		closeFDs([]int{fd})
		return fmt.Errorf("%w: %d segments held", ErrLimit, lim.MaxBuffers)
	}
	reg := c.s.deps.Registry
	id := reg.NextID()
	buf, err := c.s.deps.MapBuffer(id, fd, m.Size, lim.MaxBufferSize)
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
	wire.SetResponse[wire.RegisterBufferResponse](&c.resp).Segment = uint64(id)
	return nil
}

func (c *conn) registerFile(m *wire.RegisterFileRequest) error {
	op := c.s.deps.FileOpener
	if op == nil {
		return fmt.Errorf("%w: no file opener configured", ErrUnavailable)
	}
	if c.segments() >= c.s.cfg.Limits.MaxBuffers {
		return fmt.Errorf("%w: %d segments held", ErrLimit, c.s.cfg.Limits.MaxBuffers)
	}
	reg := c.s.deps.Registry
	id := reg.NextID()
	var f FileSegment
	var err error
	if to, ok := op.(TenantFileOpener); ok {
		name := ""
		if c.tenant != nil {
			name = c.tenant.Name
		}
		f, err = to.OpenFileFor(name, id, string(m.Path), m.Direct, m.Size)
	} else {
		f, err = op.OpenFile(id, string(m.Path), m.Direct, m.Size)
	}
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
	r := wire.SetResponse[wire.RegisterFileResponse](&c.resp)
	r.Segment, r.Size = uint64(id), f.Size()
	return nil
}

func (c *conn) unregister(m *wire.UnregisterBufferRequest) error {
	id := xfer.SegmentID(m.Segment)
	c.mu.Lock()
	b, isBuf := c.buffers[id]
	f, isFile := c.files[id]
	delete(c.buffers, id)
	delete(c.files, id)
	c.segGen.Add(1)
	c.mu.Unlock()
	if !isBuf && !isFile {
		return fmt.Errorf("%w: segment %d", ErrNotFound, id)
	}
	c.dropExportsOf(id)
	c.s.deps.Registry.Remove(id)
	wire.SetResponse[wire.UnregisterBufferResponse](&c.resp)
	if isBuf {
		return b.Close()
	}
	return f.Close()
}

// errNoPool answers the pool calls of a connection without a tenant.
var errNoPool = fmt.Errorf("%w: this user is in no tenant, so it has no pool", ErrPermission)

// poolInfo answers with the connection's tenant's pool and passes its memfd:
// the only pool this client can map.
func (c *conn) poolInfo() (int, error) {
	p := c.pool
	if p == nil {
		return -1, errNoPool
	}
	r := wire.SetResponse[wire.PoolInfoResponse](&c.resp)
	r.Segment, r.Size, r.BlockClasses = uint64(p.ID()), p.Size(), blockClasses(p)
	return p.Fd(), nil
}

func (c *conn) allocBlocks(m *wire.AllocBlocksRequest) error {
	n := int(m.N)
	if n == 0 || m.Size == 0 {
		return fmt.Errorf("%w: %d blocks of %d bytes", ErrMalformed, n, m.Size)
	}
	if c.blocks.len()+n > c.s.cfg.Limits.MaxBlocks {
		return fmt.Errorf("%w: %d blocks held, %d asked (max %d)", ErrLimit, c.blocks.len(), n, c.s.cfg.Limits.MaxBlocks)
	}
	p := c.pool
	if p == nil {
		return errNoPool
	}
	c.offs = slices.Grow(c.offs[:0], n)[:n]
	offs := c.offs
	if err := p.AllocN(m.Size, offs); err != nil {
		return err
	}
	for _, off := range offs {
		size, ok := p.BlockSize(off)
		if !ok {
			size = m.Size
		}
		c.blocks.add(off, size)
	}
	wire.SetResponse[wire.AllocBlocksResponse](&c.resp).Offsets = offs
	return nil
}

func (c *conn) freeBlocks(m *wire.FreeBlocksRequest) {
	c.codes = c.codes[:0]
	p := c.pool
	for _, off := range m.Offsets {
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
	wire.SetResponse[wire.FreeBlocksResponse](&c.resp).Codes = c.codes
}

func (c *conn) allocBatch(m *wire.AllocBatchRequest) error {
	lim := &c.s.cfg.Limits
	if m.Capacity == 0 || int(m.Capacity) > lim.MaxBatchCapacity {
		return fmt.Errorf("%w: batch capacity %d (max %d)", ErrLimit, m.Capacity, lim.MaxBatchCapacity)
	}
	if len(c.batches) >= lim.MaxBatches {
		return fmt.Errorf("%w: %d batches held", ErrLimit, lim.MaxBatches)
	}
	id, err := c.s.deps.Engine.AllocateBatch(int(m.Capacity))
	if err != nil {
		return err
	}
	c.batches[id] = struct{}{}
	wire.SetResponse[wire.AllocBatchResponse](&c.resp).Batch = uint64(id)
	return nil
}

func (c *conn) ownBatch(batch uint64) (BatchID, error) {
	id := BatchID(batch)
	if _, ok := c.batches[id]; !ok {
		return 0, fmt.Errorf("%w: batch %d", ErrNotFound, id)
	}
	return id, nil
}

// stageRequests copies reqs into c.reqs for the engine, each checked by
// checkRequest: a refused request gets its code in c.codes (OK for the
// others) and is replaced in c.reqs by its standIn, so that the engine
// refuses it in its place and positions stay aligned. c.errs is cleared
// for the engine's results.
func (c *conn) stageRequests(reqs []xfer.Request) {
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
func (c *conn) checkRequest(q *xfer.Request) Code {
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
func (c *conn) mayTouch(id xfer.SegmentID, off, n uint64) Code {
	if n == 0 {
		return tcproto.CodeINVALID_ARGUMENT
	}
	if c.pool != nil && id == c.pool.ID() {
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

// standIn is what the engine is given in place of a refused request q: a
// request naming segment 0, which no resolver knows, so that the engine
// refuses it at q's position without touching anything.
func standIn(q xfer.Request) xfer.Request { return xfer.Request{Op: q.Op} }

func (c *conn) submitOpts() SubmitOptions {
	var d time.Time
	if c.req.Ctx.DeadlineMS > 0 {
		d = time.Now().Add(time.Duration(c.req.Ctx.DeadlineMS) * time.Millisecond)
	}
	return SubmitOptions{Deadline: d, Resolver: c}
}

func (c *conn) submit(m *wire.SubmitRequest) error {
	id, err := c.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	if len(m.Requests) > c.s.cfg.Limits.MaxRequests {
		return fmt.Errorf("%w: %d requests (max %d)", ErrLimit, len(m.Requests), c.s.cfg.Limits.MaxRequests)
	}
	c.stageRequests(m.Requests)
	opts := c.submitOpts()
	opts.Notify = c.notifyArgs(m.Notify)
	if err := c.s.deps.Engine.Submit(id, c.reqs, opts, c.errs); err != nil {
		return err
	}
	for i := range c.codes {
		if c.codes[i] == tcproto.CodeOK {
			c.codes[i] = CodeOf(c.errs[i])
		}
	}
	wire.SetResponse[wire.SubmitResponse](&c.resp).Codes = c.codes
	return nil
}

func (c *conn) taskStatus(m *wire.TaskStatusRequest) error {
	id, err := c.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	st, err := c.s.deps.Engine.Status(id, int(m.Index))
	if err != nil {
		return err
	}
	code := tcproto.CodeOK
	if st.State.Terminal() {
		code = c.taskCode(st.State, st.Err)
	}
	*wire.SetResponse[wire.TaskStatusResponse](&c.resp) = wire.TaskStatusResponse{
		State: tcproto.TaskState(st.State), Transferred: st.Transferred, Code: code}
	return nil
}

func summaryFrom(s BatchSummary) wire.Summary {
	return wire.Summary{Total: uint32(s.Total), Waiting: uint32(s.Waiting), Pending: uint32(s.Pending),
		Completed: uint32(s.Completed), Failed: uint32(s.Failed), Timeout: uint32(s.Timeout), Canceled: uint32(s.Canceled),
		Transferred: s.Transferred}
}

func (c *conn) batchStatus(m *wire.BatchStatusRequest) error {
	id, err := c.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	s, err := c.s.deps.Engine.BatchStatus(id)
	if err != nil {
		return err
	}
	wire.SetResponse[wire.BatchStatusResponse](&c.resp).Summary = summaryFrom(s)
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

func (c *conn) waitBatch(m *wire.WaitRequest) error {
	id, err := c.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	s, err := c.wait(id, c.deadline(m.TimeoutMS), c.s.closing)
	if err != nil {
		return err
	}
	wire.SetResponse[wire.WaitResponse](&c.resp).Summary = summaryFrom(s)
	return nil
}

func (c *conn) freeBatch(m *wire.FreeBatchRequest) error {
	id, err := c.ownBatch(m.Batch)
	if err != nil {
		return err
	}
	if err := c.s.deps.Engine.Free(id); err != nil {
		return err
	}
	delete(c.batches, id)
	wire.SetResponse[wire.FreeBatchResponse](&c.resp)
	return nil
}

// transfer is the one-shot call: allocate a batch, submit, wait, free.
func (c *conn) transfer(m *wire.TransferRequestBody) error {
	n := len(m.Requests)
	if n > c.s.cfg.Limits.MaxBatchCapacity {
		return fmt.Errorf("%w: %d requests (max %d)", ErrLimit, n, c.s.cfg.Limits.MaxBatchCapacity)
	}
	e := c.s.deps.Engine
	id, err := e.AllocateBatch(n)
	if err != nil {
		return err
	}
	c.batches[id] = struct{}{} // released on close should anything below fail hard
	deadline := c.deadline(m.TimeoutMS)
	c.stageRequests(m.Requests)
	err = e.Submit(id, c.reqs, SubmitOptions{Deadline: deadline, Resolver: c, Notify: c.notifyArgs(m.Notify)}, c.errs)
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
	*wire.SetResponse[wire.TransferResponse](&c.resp) = wire.TransferResponse{Codes: c.codes, States: states, Summary: summaryFrom(sum)}
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
	r := wire.SetResponse[wire.StatsResponse](&c.resp)
	if c.pool != nil {
		r.Pool = statsCounters(c.pool, nil)
	}
	if c.tenant == nil || c.s.isAdmin(c.cred.Uid) {
		r.Pool = c.s.tenantCounters(r.Pool)
	}
	r.Engine = statsCounters(c.s.deps.Engine, nil)
	if n, ok := c.s.deps.Registry.(interface{ Len() int }); ok {
		// Every registered segment (pools, buffers, files, remotes): what a
		// leak check compares before and after a run.
		r.Engine = append(r.Engine, wire.Counter{Name: "segments_registered", Value: uint64(n.Len())})
	}
	r.Connections = uint32(c.s.Connections())
	if f := c.s.deps.TransportStats; f != nil {
		r.Transports = f(nil)
	}
	qt := c.s.QueueTotals()
	r.Transports = append(r.Transports,
		wire.Counter{Name: "queue.open", Value: qt.Open}, wire.Counter{Name: "queue.opened", Value: qt.Opened},
		wire.Counter{Name: "queue.completions", Value: qt.Completions},
		wire.Counter{Name: "queue.client_wakes", Value: qt.ClientWakes},
		wire.Counter{Name: "queue.worker_sleeps", Value: qt.WorkerSleeps},
		wire.Counter{Name: "queue.worker_spins", Value: qt.WorkerSpins},
		wire.Counter{Name: "queue.violations", Value: qt.Violations})
	r.Connection = []wire.Counter{
		{Name: "segments", Value: uint64(c.segments())},
		{Name: "blocks", Value: uint64(c.blocks.len())},
		{Name: "batches", Value: uint64(len(c.batches))},
		{Name: "idempotency_keys", Value: uint64(len(c.idem.order))},
		{Name: "exports", Value: uint64(len(c.exports))},
		{Name: "remotes", Value: uint64(c.remoteCount())},
		{Name: "notifications_queued", Value: uint64(c.inbox.Len())},
	}
	r.Connection = c.queueCounters(r.Connection)
	r.Store = c.storeCounters()
}

// release frees everything the connection holds, whatever state it is in:
// stray fds, batches (abandoning those still busy after ReleaseWait, or at
// once when the server closes: a drain gave them their time already),
// registered segments and pool blocks.
func (c *conn) release() {
	// Queues first: their workers resolve the segments and blocks released
	// below, and what they have in flight ends Canceled with its CQE.
	c.qmu.Lock()
	queues := c.queues
	c.queues = map[uint64]*cqueue{}
	c.qmu.Unlock()
	for _, q := range queues {
		q.close()
	}
	c.closeStore() // its pins, leases and reservations; no queue can use it any more
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
	c.segGen.Add(1)
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
	p := c.pool
	exported := func(i int) bool { return c.exported(c.poolID(), c.blocks.offs[i], c.blocks.sizes[i]) }
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
	c.blocks.reset()
	// Its keys may run afresh on another connection now.
	c.s.idem.closed(c.id)
	c.log.Debug("connection resources released")
}
