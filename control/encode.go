package control

import (
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// EncodeRequest builds m into b (which it resets) and returns the whole
// frame: the u32 little-endian length followed by the flatbuffer. The
// returned slice aliases b's buffer and is valid until b is used again.
func EncodeRequest(b *flatbuffers.Builder, m *Request) []byte {
	b.Reset()
	var key, lane, name, payload, offs, reqs, notify flatbuffers.UOffsetT
	if len(m.Ctx.IdempotencyKey) > 0 {
		key = b.CreateByteString(m.Ctx.IdempotencyKey)
	}
	if len(m.Ctx.Lane) > 0 {
		lane = b.CreateByteString(m.Ctx.Lane)
	}
	switch m.Kind {
	case tcproto.RequestBodyHelloRequest, tcproto.RequestBodyRegisterFileRequest,
		tcproto.RequestBodyExportSegmentRequest, tcproto.RequestBodyUnexportSegmentRequest,
		tcproto.RequestBodyOpenRemoteRequest, tcproto.RequestBodySubscribeRequest:
		name = b.CreateByteString(m.Name)
	case tcproto.RequestBodyPingRequest:
		payload = b.CreateByteVector(m.Payload)
	case tcproto.RequestBodyFreeBlocksRequest:
		offs = uint64Vector(b, m.Offsets)
	case tcproto.RequestBodySubmitRequest, tcproto.RequestBodyTransferRequestBody:
		reqs = transferVector(b, m.Requests)
		notify = notifyVector(b, m.Notify)
	}

	var body flatbuffers.UOffsetT
	switch m.Kind {
	case tcproto.RequestBodyHelloRequest:
		tcproto.HelloRequestStart(b)
		tcproto.HelloRequestAddProtocolVersion(b, m.ProtocolVersion)
		tcproto.HelloRequestAddClientName(b, name)
		body = tcproto.HelloRequestEnd(b)
	case tcproto.RequestBodyPingRequest:
		tcproto.PingRequestStart(b)
		tcproto.PingRequestAddPayload(b, payload)
		body = tcproto.PingRequestEnd(b)
	case tcproto.RequestBodyRegisterBufferRequest:
		tcproto.RegisterBufferRequestStart(b)
		tcproto.RegisterBufferRequestAddSize(b, m.Size)
		body = tcproto.RegisterBufferRequestEnd(b)
	case tcproto.RequestBodyUnregisterBufferRequest:
		tcproto.UnregisterBufferRequestStart(b)
		tcproto.UnregisterBufferRequestAddSegmentId(b, m.Segment)
		body = tcproto.UnregisterBufferRequestEnd(b)
	case tcproto.RequestBodyPoolInfoRequest:
		tcproto.PoolInfoRequestStart(b)
		body = tcproto.PoolInfoRequestEnd(b)
	case tcproto.RequestBodyAllocBlocksRequest:
		tcproto.AllocBlocksRequestStart(b)
		tcproto.AllocBlocksRequestAddN(b, m.N)
		tcproto.AllocBlocksRequestAddSize(b, m.Size)
		body = tcproto.AllocBlocksRequestEnd(b)
	case tcproto.RequestBodyFreeBlocksRequest:
		tcproto.FreeBlocksRequestStart(b)
		tcproto.FreeBlocksRequestAddOffsets(b, offs)
		body = tcproto.FreeBlocksRequestEnd(b)
	case tcproto.RequestBodyAllocBatchRequest:
		tcproto.AllocBatchRequestStart(b)
		tcproto.AllocBatchRequestAddCapacity(b, m.Capacity)
		body = tcproto.AllocBatchRequestEnd(b)
	case tcproto.RequestBodySubmitRequest:
		tcproto.SubmitRequestStart(b)
		tcproto.SubmitRequestAddBatchId(b, m.Batch)
		tcproto.SubmitRequestAddRequests(b, reqs)
		if notify != 0 {
			tcproto.SubmitRequestAddNotify(b, notify)
		}
		body = tcproto.SubmitRequestEnd(b)
	case tcproto.RequestBodyTaskStatusRequest:
		tcproto.TaskStatusRequestStart(b)
		tcproto.TaskStatusRequestAddBatchId(b, m.Batch)
		tcproto.TaskStatusRequestAddIndex(b, m.Index)
		body = tcproto.TaskStatusRequestEnd(b)
	case tcproto.RequestBodyBatchStatusRequest:
		tcproto.BatchStatusRequestStart(b)
		tcproto.BatchStatusRequestAddBatchId(b, m.Batch)
		body = tcproto.BatchStatusRequestEnd(b)
	case tcproto.RequestBodyWaitRequest:
		tcproto.WaitRequestStart(b)
		tcproto.WaitRequestAddBatchId(b, m.Batch)
		tcproto.WaitRequestAddTimeoutMs(b, m.TimeoutMS)
		body = tcproto.WaitRequestEnd(b)
	case tcproto.RequestBodyFreeBatchRequest:
		tcproto.FreeBatchRequestStart(b)
		tcproto.FreeBatchRequestAddBatchId(b, m.Batch)
		body = tcproto.FreeBatchRequestEnd(b)
	case tcproto.RequestBodyTransferRequestBody:
		tcproto.TransferRequestBodyStart(b)
		tcproto.TransferRequestBodyAddRequests(b, reqs)
		tcproto.TransferRequestBodyAddTimeoutMs(b, m.TimeoutMS)
		if notify != 0 {
			tcproto.TransferRequestBodyAddNotify(b, notify)
		}
		body = tcproto.TransferRequestBodyEnd(b)
	case tcproto.RequestBodyStatsRequest:
		tcproto.StatsRequestStart(b)
		body = tcproto.StatsRequestEnd(b)
	case tcproto.RequestBodyRegisterFileRequest:
		tcproto.RegisterFileRequestStart(b)
		tcproto.RegisterFileRequestAddPath(b, name)
		tcproto.RegisterFileRequestAddDirect(b, m.Direct)
		tcproto.RegisterFileRequestAddSize(b, m.Size)
		body = tcproto.RegisterFileRequestEnd(b)
	case tcproto.RequestBodyExportSegmentRequest:
		tcproto.ExportSegmentRequestStart(b)
		tcproto.ExportSegmentRequestAddName(b, name)
		tcproto.ExportSegmentRequestAddSegmentId(b, m.Segment)
		tcproto.ExportSegmentRequestAddOffset(b, m.Offset)
		tcproto.ExportSegmentRequestAddLength(b, m.Length)
		tcproto.ExportSegmentRequestAddRights(b, m.Rights)
		body = tcproto.ExportSegmentRequestEnd(b)
	case tcproto.RequestBodyUnexportSegmentRequest:
		tcproto.UnexportSegmentRequestStart(b)
		tcproto.UnexportSegmentRequestAddName(b, name)
		body = tcproto.UnexportSegmentRequestEnd(b)
	case tcproto.RequestBodyOpenRemoteRequest:
		tcproto.OpenRemoteRequestStart(b)
		tcproto.OpenRemoteRequestAddName(b, name)
		tcproto.OpenRemoteRequestAddRights(b, m.Rights)
		tcproto.OpenRemoteRequestAddTransport(b, tcproto.Transport(m.Transport))
		body = tcproto.OpenRemoteRequestEnd(b)
	case tcproto.RequestBodyCloseRemoteRequest:
		tcproto.CloseRemoteRequestStart(b)
		tcproto.CloseRemoteRequestAddSegmentId(b, m.Segment)
		body = tcproto.CloseRemoteRequestEnd(b)
	case tcproto.RequestBodySubscribeRequest:
		tcproto.SubscribeRequestStart(b)
		tcproto.SubscribeRequestAddName(b, name)
		body = tcproto.SubscribeRequestEnd(b)
	case tcproto.RequestBodyPollNotificationsRequest:
		tcproto.PollNotificationsRequestStart(b)
		tcproto.PollNotificationsRequestAddTimeoutMs(b, m.TimeoutMS)
		tcproto.PollNotificationsRequestAddMax(b, m.Max)
		body = tcproto.PollNotificationsRequestEnd(b)
	case tcproto.RequestBodyPeersRequest:
		tcproto.PeersRequestStart(b)
		body = tcproto.PeersRequestEnd(b)
	case tcproto.RequestBodySegmentsRequest:
		tcproto.SegmentsRequestStart(b)
		body = tcproto.SegmentsRequestEnd(b)
	case tcproto.RequestBodyRdmaRequest:
		tcproto.RdmaRequestStart(b)
		body = tcproto.RdmaRequestEnd(b)
	}

	tcproto.ContextStart(b)
	tcproto.ContextAddRequestId(b, m.Ctx.RequestID)
	if key != 0 {
		tcproto.ContextAddIdempotencyKey(b, key)
	}
	if lane != 0 {
		tcproto.ContextAddLane(b, lane)
	}
	tcproto.ContextAddPolicyVersion(b, m.Ctx.PolicyVersion)
	tcproto.ContextAddQos(b, m.Ctx.QoS)
	tcproto.ContextAddDeadlineMs(b, m.Ctx.DeadlineMS)
	ctx := tcproto.ContextEnd(b)

	tcproto.RequestStart(b)
	tcproto.RequestAddCtx(b, ctx)
	if body != 0 {
		tcproto.RequestAddBodyType(b, m.Kind)
		tcproto.RequestAddBody(b, body)
	}
	b.FinishSizePrefixed(tcproto.RequestEnd(b))
	return b.FinishedBytes()
}

func uint64Vector(b *flatbuffers.Builder, v []uint64) flatbuffers.UOffsetT {
	b.StartVector(8, len(v), 8)
	for i := len(v) - 1; i >= 0; i-- {
		b.PrependUint64(v[i])
	}
	return b.EndVector(len(v))
}

// notifyVector encodes the positional notify vector; 0 when v is empty.
func notifyVector(b *flatbuffers.Builder, v [][]byte) flatbuffers.UOffsetT {
	if len(v) == 0 {
		return 0
	}
	offs := make([]flatbuffers.UOffsetT, len(v))
	for i := range v {
		var p flatbuffers.UOffsetT
		if len(v[i]) > 0 {
			p = b.CreateByteVector(v[i])
		}
		tcproto.NotifyStart(b)
		if p != 0 {
			tcproto.NotifyAddPayload(b, p)
		}
		offs[i] = tcproto.NotifyEnd(b)
	}
	return tableVector(b, offs)
}

func tableVector(b *flatbuffers.Builder, offs []flatbuffers.UOffsetT) flatbuffers.UOffsetT {
	b.StartVector(4, len(offs), 4)
	for i := len(offs) - 1; i >= 0; i-- {
		b.PrependUOffsetT(offs[i])
	}
	return b.EndVector(len(offs))
}

func codeVector(b *flatbuffers.Builder, v []Code) flatbuffers.UOffsetT {
	b.StartVector(1, len(v), 1)
	for i := len(v) - 1; i >= 0; i-- {
		b.PrependByte(byte(v[i]))
	}
	return b.EndVector(len(v))
}

func stateVector(b *flatbuffers.Builder, v []tcproto.TaskState) flatbuffers.UOffsetT {
	b.StartVector(1, len(v), 1)
	for i := len(v) - 1; i >= 0; i-- {
		b.PrependByte(byte(v[i]))
	}
	return b.EndVector(len(v))
}

func transferVector(b *flatbuffers.Builder, v []xfer.Request) flatbuffers.UOffsetT {
	b.StartVector(transferRequestSize, len(v), 8)
	for i := len(v) - 1; i >= 0; i-- {
		r := &v[i]
		tcproto.CreateTransferRequest(b, uint64(r.Local), r.LocalOffset, uint64(r.Target), r.TargetOffset, r.Length, tcproto.Op(r.Op))
	}
	return b.EndVector(len(v))
}

func counterVector(b *flatbuffers.Builder, v []Counter) flatbuffers.UOffsetT {
	if len(v) == 0 {
		return 0
	}
	offs := make([]flatbuffers.UOffsetT, len(v))
	for i := range v {
		name := b.CreateString(v[i].Name)
		tcproto.CounterStart(b)
		tcproto.CounterAddName(b, name)
		tcproto.CounterAddValue(b, v[i].Value)
		offs[i] = tcproto.CounterEnd(b)
	}
	b.StartVector(4, len(v), 4)
	for i := len(offs) - 1; i >= 0; i-- {
		b.PrependUOffsetT(offs[i])
	}
	return b.EndVector(len(v))
}

func summaryStruct(b *flatbuffers.Builder, s *Summary) flatbuffers.UOffsetT {
	return tcproto.CreateBatchSummary(b, s.Total, s.Waiting, s.Pending, s.Completed, s.Failed, s.Timeout, s.Canceled, s.Transferred)
}

// EncodeResponse builds m into b (which it resets) and returns the whole
// frame, length prefix included. The slice aliases b's buffer.
func EncodeResponse(b *flatbuffers.Builder, m *Response) []byte {
	b.Reset()
	var msg, s1, s2, v1, v2, v3 flatbuffers.UOffsetT
	if len(m.Message) > 0 {
		msg = b.CreateByteString(m.Message)
	}
	var body flatbuffers.UOffsetT
	switch m.Kind {
	case tcproto.ResponseBodyHelloResponse:
		s1 = b.CreateByteString(m.DaemonID)
		s2 = b.CreateByteString(m.Version)
		var pa flatbuffers.UOffsetT
		if len(m.PeerAddr) > 0 {
			pa = b.CreateByteString(m.PeerAddr)
		}
		l := &m.Limits
		tcproto.LimitsStart(b)
		tcproto.LimitsAddMaxFrame(b, l.MaxFrame)
		tcproto.LimitsAddMaxBuffers(b, l.MaxBuffers)
		tcproto.LimitsAddMaxBlocks(b, l.MaxBlocks)
		tcproto.LimitsAddMaxBatches(b, l.MaxBatches)
		tcproto.LimitsAddMaxBatchCapacity(b, l.MaxBatchCapacity)
		tcproto.LimitsAddMaxRequests(b, l.MaxRequests)
		tcproto.LimitsAddMaxIdempotencyKeys(b, l.MaxIdempotencyKeys)
		lim := tcproto.LimitsEnd(b)
		tcproto.HelloResponseStart(b)
		tcproto.HelloResponseAddProtocolVersion(b, m.ProtocolVersion)
		tcproto.HelloResponseAddDaemonId(b, s1)
		tcproto.HelloResponseAddVersion(b, s2)
		tcproto.HelloResponseAddLimits(b, lim)
		if pa != 0 {
			tcproto.HelloResponseAddPeerAddr(b, pa)
		}
		body = tcproto.HelloResponseEnd(b)
	case tcproto.ResponseBodyPingResponse:
		v1 = b.CreateByteVector(m.Payload)
		tcproto.PingResponseStart(b)
		tcproto.PingResponseAddPayload(b, v1)
		body = tcproto.PingResponseEnd(b)
	case tcproto.ResponseBodyRegisterBufferResponse:
		tcproto.RegisterBufferResponseStart(b)
		tcproto.RegisterBufferResponseAddSegmentId(b, m.Segment)
		body = tcproto.RegisterBufferResponseEnd(b)
	case tcproto.ResponseBodyUnregisterBufferResponse:
		tcproto.UnregisterBufferResponseStart(b)
		body = tcproto.UnregisterBufferResponseEnd(b)
	case tcproto.ResponseBodyPoolInfoResponse:
		v1 = uint64Vector(b, m.BlockClasses)
		tcproto.PoolInfoResponseStart(b)
		tcproto.PoolInfoResponseAddSegmentId(b, m.Segment)
		tcproto.PoolInfoResponseAddSize(b, m.Size)
		tcproto.PoolInfoResponseAddBlockClasses(b, v1)
		body = tcproto.PoolInfoResponseEnd(b)
	case tcproto.ResponseBodyAllocBlocksResponse:
		v1 = uint64Vector(b, m.Offsets)
		tcproto.AllocBlocksResponseStart(b)
		tcproto.AllocBlocksResponseAddOffsets(b, v1)
		body = tcproto.AllocBlocksResponseEnd(b)
	case tcproto.ResponseBodyFreeBlocksResponse:
		v1 = codeVector(b, m.Codes)
		tcproto.FreeBlocksResponseStart(b)
		tcproto.FreeBlocksResponseAddCodes(b, v1)
		body = tcproto.FreeBlocksResponseEnd(b)
	case tcproto.ResponseBodyAllocBatchResponse:
		tcproto.AllocBatchResponseStart(b)
		tcproto.AllocBatchResponseAddBatchId(b, m.Batch)
		body = tcproto.AllocBatchResponseEnd(b)
	case tcproto.ResponseBodySubmitResponse:
		v1 = codeVector(b, m.Codes)
		tcproto.SubmitResponseStart(b)
		tcproto.SubmitResponseAddCodes(b, v1)
		body = tcproto.SubmitResponseEnd(b)
	case tcproto.ResponseBodyTaskStatusResponse:
		tcproto.TaskStatusResponseStart(b)
		tcproto.TaskStatusResponseAddState(b, m.Task.State)
		tcproto.TaskStatusResponseAddTransferred(b, m.Task.Transferred)
		tcproto.TaskStatusResponseAddCode(b, m.Task.Code)
		body = tcproto.TaskStatusResponseEnd(b)
	case tcproto.ResponseBodyBatchStatusResponse:
		tcproto.BatchStatusResponseStart(b)
		tcproto.BatchStatusResponseAddSummary(b, summaryStruct(b, &m.Summary))
		body = tcproto.BatchStatusResponseEnd(b)
	case tcproto.ResponseBodyWaitResponse:
		tcproto.WaitResponseStart(b)
		tcproto.WaitResponseAddSummary(b, summaryStruct(b, &m.Summary))
		body = tcproto.WaitResponseEnd(b)
	case tcproto.ResponseBodyFreeBatchResponse:
		tcproto.FreeBatchResponseStart(b)
		body = tcproto.FreeBatchResponseEnd(b)
	case tcproto.ResponseBodyTransferResponse:
		v1 = codeVector(b, m.Codes)
		v2 = stateVector(b, m.States)
		tcproto.TransferResponseStart(b)
		tcproto.TransferResponseAddCodes(b, v1)
		tcproto.TransferResponseAddStates(b, v2)
		tcproto.TransferResponseAddSummary(b, summaryStruct(b, &m.Summary))
		body = tcproto.TransferResponseEnd(b)
	case tcproto.ResponseBodyStatsResponse:
		v1 = counterVector(b, m.Pool)
		v2 = counterVector(b, m.Engine)
		v3 = counterVector(b, m.Conn)
		v4 := counterVector(b, m.Transports)
		tcproto.StatsResponseStart(b)
		if v4 != 0 {
			tcproto.StatsResponseAddTransports(b, v4)
		}
		if v1 != 0 {
			tcproto.StatsResponseAddPool(b, v1)
		}
		if v2 != 0 {
			tcproto.StatsResponseAddEngine(b, v2)
		}
		if v3 != 0 {
			tcproto.StatsResponseAddConnection(b, v3)
		}
		tcproto.StatsResponseAddConnections(b, m.Connections)
		body = tcproto.StatsResponseEnd(b)
	case tcproto.ResponseBodyRegisterFileResponse:
		tcproto.RegisterFileResponseStart(b)
		tcproto.RegisterFileResponseAddSegmentId(b, m.Segment)
		tcproto.RegisterFileResponseAddSize(b, m.Size)
		body = tcproto.RegisterFileResponseEnd(b)
	case tcproto.ResponseBodyExportSegmentResponse:
		tcproto.ExportSegmentResponseStart(b)
		tcproto.ExportSegmentResponseAddSize(b, m.Size)
		body = tcproto.ExportSegmentResponseEnd(b)
	case tcproto.ResponseBodyUnexportSegmentResponse:
		tcproto.UnexportSegmentResponseStart(b)
		body = tcproto.UnexportSegmentResponseEnd(b)
	case tcproto.ResponseBodyOpenRemoteResponse:
		tcproto.OpenRemoteResponseStart(b)
		tcproto.OpenRemoteResponseAddSegmentId(b, m.Segment)
		tcproto.OpenRemoteResponseAddSize(b, m.Size)
		tcproto.OpenRemoteResponseAddEpoch(b, m.Epoch)
		body = tcproto.OpenRemoteResponseEnd(b)
	case tcproto.ResponseBodyCloseRemoteResponse:
		tcproto.CloseRemoteResponseStart(b)
		body = tcproto.CloseRemoteResponseEnd(b)
	case tcproto.ResponseBodySubscribeResponse:
		tcproto.SubscribeResponseStart(b)
		body = tcproto.SubscribeResponseEnd(b)
	case tcproto.ResponseBodyPollNotificationsResponse:
		offs := make([]flatbuffers.UOffsetT, len(m.Notifications))
		for i := range m.Notifications {
			n := &m.Notifications[i]
			seg := b.CreateByteString(n.Segment)
			p := b.CreateByteVector(n.Payload)
			tcproto.NotificationStart(b)
			tcproto.NotificationAddSegment(b, seg)
			tcproto.NotificationAddPayload(b, p)
			offs[i] = tcproto.NotificationEnd(b)
		}
		v1 = tableVector(b, offs)
		tcproto.PollNotificationsResponseStart(b)
		tcproto.PollNotificationsResponseAddNotifications(b, v1)
		body = tcproto.PollNotificationsResponseEnd(b)
	case tcproto.ResponseBodyPeersResponse:
		offs := make([]flatbuffers.UOffsetT, len(m.Peers))
		for i := range m.Peers {
			p := &m.Peers[i]
			id := b.CreateByteString(p.ID)
			addr := b.CreateByteString(p.Addr)
			tcproto.PeerInfoStart(b)
			tcproto.PeerInfoAddId(b, id)
			tcproto.PeerInfoAddAddr(b, addr)
			tcproto.PeerInfoAddEpoch(b, p.Epoch)
			tcproto.PeerInfoAddConnected(b, p.Connected)
			tcproto.PeerInfoAddBytesIn(b, p.BytesIn)
			tcproto.PeerInfoAddBytesOut(b, p.BytesOut)
			tcproto.PeerInfoAddErrors(b, p.Errors)
			offs[i] = tcproto.PeerInfoEnd(b)
		}
		v1 = tableVector(b, offs)
		tcproto.PeersResponseStart(b)
		tcproto.PeersResponseAddPeers(b, v1)
		body = tcproto.PeersResponseEnd(b)
	case tcproto.ResponseBodySegmentsResponse:
		offs := make([]flatbuffers.UOffsetT, len(m.Segments))
		for i := range m.Segments {
			si := &m.Segments[i]
			name := b.CreateByteString(si.Name)
			var peer flatbuffers.UOffsetT
			if len(si.Peer) > 0 {
				peer = b.CreateByteString(si.Peer)
			}
			tcproto.SegmentInfoStart(b)
			tcproto.SegmentInfoAddName(b, name)
			if peer != 0 {
				tcproto.SegmentInfoAddPeer(b, peer)
			}
			tcproto.SegmentInfoAddSegmentId(b, si.Segment)
			tcproto.SegmentInfoAddSize(b, si.Size)
			tcproto.SegmentInfoAddRights(b, si.Rights)
			tcproto.SegmentInfoAddEpoch(b, si.Epoch)
			tcproto.SegmentInfoAddTransport(b, tcproto.Transport(si.Transport))
			offs[i] = tcproto.SegmentInfoEnd(b)
		}
		v1 = tableVector(b, offs)
		tcproto.SegmentsResponseStart(b)
		tcproto.SegmentsResponseAddSegments(b, v1)
		body = tcproto.SegmentsResponseEnd(b)
	case tcproto.ResponseBodyRdmaResponse:
		body = encodeRDMA(b, &m.RDMA)
	}
	tcproto.ResponseStart(b)
	tcproto.ResponseAddStatus(b, m.Status)
	tcproto.ResponseAddRequestId(b, m.RequestID)
	if msg != 0 {
		tcproto.ResponseAddMessage(b, msg)
	}
	if body != 0 {
		tcproto.ResponseAddBodyType(b, m.Kind)
		tcproto.ResponseAddBody(b, body)
	}
	b.FinishSizePrefixed(tcproto.ResponseEnd(b))
	return b.FinishedBytes()
}
