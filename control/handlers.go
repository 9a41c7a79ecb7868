package control

// The serving of one request: handle dispatches c.req to its handler,
// makes mutating calls idempotent by key and audits them; Hello is
// answered here.

import (
	"context"
	"fmt"
	"log/slog"
	"syscall"

	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/wire"
)

// handle serves c.req and returns the answer frame and the fd to pass with
// it (-1 for none).
func (c *conn) handle() ([]byte, int) {
	m := &c.req
	kind := m.Kind()
	if c.fdsLost {
		closeFDs(c.fds)
		c.fds, c.fdsLost = c.fds[:0], false
		c.s.logs.lostFDs.Event(append(c.who(), slog.String("kind", kind.String()), slog.Uint64("request_id", m.Ctx.RequestID))...)
		return c.errorFrame(fmt.Errorf("%w: file descriptor not received", syscall.EMFILE)), -1
	}
	if _, takesFD := m.Body.(*wire.RegisterBufferRequest); !takesFD && len(c.fds) > 0 {
		closeFDs(c.fds)
		c.fds = c.fds[:0]
		c.s.logs.unexpectedFD.Event(append(c.who(), slog.String("kind", kind.String()), slog.Uint64("request_id", m.Ctx.RequestID))...)
		return c.errorFrame(ErrUnexpectedFD), -1
	}
	mut := mutating(kind)
	keyed := mut && len(m.Ctx.IdempotencyKey) > 0 && kind != kindOpenQueue
	var h uint64
	if keyed {
		h = argsHash(c.b, m)
		if frame, err := c.idemLookup(m, h); frame != nil || err != nil {
			closeFDs(c.fds)
			c.fds = c.fds[:0]
			if err != nil {
				c.audit(m, codeFailedPrecondition, true)
				return c.errorFrame(err), -1
			}
			c.audit(m, codeOK, true)
			return c.idemReplay(frame), -1
		}
	}

	c.resp.Reset(m.Ctx.RequestID)
	fd := -1
	var err error
	ss, r, ctx := c.ss, &c.resp, &m.Ctx
	switch b := m.Body.(type) {
	case *wire.HelloRequest:
		c.hello(b)
	case *wire.PingRequest:
		wire.SetResponse[wire.PingResponse](r).Payload = b.Payload
	case *wire.RegisterBufferRequest:
		if fd, err = c.takeFD(); err == nil {
			err = ss.RegisterBuffer(b, fd, r)
		}
		fd = -1
	case *wire.UnregisterBufferRequest:
		err = ss.Unregister(b, r)
	case *wire.PoolInfoRequest:
		fd, err = ss.PoolInfo(r)
	case *wire.AllocBlocksRequest:
		err = ss.AllocBlocks(b, r)
	case *wire.FreeBlocksRequest:
		ss.FreeBlocks(b, r)
	case *wire.AllocBatchRequest:
		err = ss.AllocBatch(b, r)
	case *wire.SubmitRequest:
		err = ss.Submit(ctx, b, r)
	case *wire.TaskStatusRequest:
		err = ss.TaskStatus(b, r)
	case *wire.BatchStatusRequest:
		err = ss.BatchStatus(b, r)
	case *wire.WaitRequest:
		err = ss.Wait(ctx, b, r)
	case *wire.FreeBatchRequest:
		err = ss.FreeBatch(b, r)
	case *wire.TransferRequestBody:
		err = ss.Transfer(ctx, b, r)
	case *wire.StatsRequest:
		c.stats()
	case *wire.RegisterFileRequest:
		err = ss.RegisterFile(b, r)
	case *wire.ExportSegmentRequest:
		err = ss.ExportSegment(b, r)
	case *wire.UnexportSegmentRequest:
		err = ss.UnexportSegment(b, r)
	case *wire.OpenRemoteRequest:
		err = ss.OpenRemote(ctx, b, r)
	case *wire.CloseRemoteRequest:
		err = ss.CloseRemote(b, r)
	case *wire.SubscribeRequest:
		err = ss.Subscribe(b, r)
	case *wire.PollNotificationsRequest:
		err = ss.PollNotifications(ctx, b, r)
	case *wire.PeersRequest:
		err = c.peers()
	case *wire.SegmentsRequest:
		c.segmentsList()
	case *wire.RDMARequest:
		c.rdmaInfo()
	case *wire.DirectoryRequest:
		err = c.directoryReport()
	case *wire.OpenQueueRequest:
		var bell int
		if fd, bell, err = ss.OpenQueue(b, r); err == nil {
			// Closed once the answer is sent; the eventfd doorbell, when
			// the queue has one, travels after the memfd.
			c.passFD, c.passFD2 = fd, bell
		}
	case *wire.CloseQueueRequest:
		err = ss.CloseQueue(b, r)
	case *wire.StorePutRequest:
		err = ss.StorePut(b, r, ctx.Replicas)
	case *wire.StoreReadRequest:
		err = ss.StoreRead(b, r)
	case *wire.StoreRemoveRequest:
		err = ss.StoreRemove(b, r)
	case *wire.StorePinRequest:
		err = ss.StorePin(b, r)
	case *wire.StoreUnpinRequest:
		err = ss.StoreUnpin(b, r)
	case *wire.StoreReserveRequest:
		err = ss.StoreReserve(b, r)
	case *wire.StoreCommitRequest:
		err = ss.StoreCommit(b, r, ctx.Replicas)
	case *wire.StoreAbortRequest:
		err = ss.StoreAbort(b, r)
	case *wire.StoreStatRequest:
		err = ss.StoreStat(b, r)
	case *wire.StoreListRequest:
		err = ss.StoreList(b, r)
	case *wire.StoreFlushRequest:
		err = ss.StoreFlush(b, r)
	case *wire.HandleIssueRequest:
		err = ss.HandleIssue(ctx, b, r)
	case *wire.HandleRenewRequest:
		err = ss.HandleRenew(ctx, b, r)
	case *wire.HandleReleaseRequest:
		err = ss.HandleRelease(ctx, b, r)
	case *wire.LeaseCreateRequest:
		err = ss.LeaseCreate(ctx, b, r)
	case *wire.LeaseReleaseRequest:
		err = ss.LeaseRelease(ctx, b, r)
	case *wire.ModeRequest:
		err = c.mode(b)
	case *wire.ClusterLocateRequest:
		err = c.clusterLocate(b)
	case *wire.ClusterShardsRequest:
		err = c.clusterShards(b)
	default:
		err = fmt.Errorf("%w: request body %s is not served", ErrMalformed, kind)
	}
	closeFDs(c.fds) // a handler that takes its fd leaves none
	c.fds = c.fds[:0]
	code := codeOK
	if err != nil {
		code = status.CodeOf(err)
		lvl := slog.LevelDebug
		if code == codeInternal {
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
	if keyed && code != codeUnavailable && code != codeInternal {
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
