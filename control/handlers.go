package control

// The serving of one request: handle dispatches c.req to its handler,
// makes mutating calls idempotent by key and audits them; Hello is
// answered here.

import (
	"context"
	"fmt"
	"github.com/tensorcast/tensorcast/status"
	"log/slog"
	"syscall"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
)

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
		code = status.CodeOf(err)
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
