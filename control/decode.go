package control

import (
	"fmt"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// DecodeRequest decodes one frame body (without its length prefix) into m.
// It is the only place the server reads a request's flatbuffer: it checks
// every offset, length and count against the frame and lim before use, and
// turns a bounds-check panic of the generated accessors into ErrMalformed.
// On error m is left in an unspecified state. m's slices are reused; its byte
// slices alias buf.
func DecodeRequest(buf []byte, lim DecodeLimits, m *Request) (err error) {
	defer recoverMalformed(&err)
	lim = lim.withDefaults()
	root, err := checkRoot(buf)
	if err != nil {
		return err
	}
	var r tcproto.Request
	r.Init(buf, root)

	*m = Request{Offsets: m.Offsets[:0], Requests: m.Requests[:0], Notify: m.Notify[:0]}
	var c tcproto.Context
	if r.Ctx(&c) != nil {
		ct := c.Table()
		m.Ctx.RequestID = c.RequestId()
		if m.Ctx.IdempotencyKey, err = bytesField(&ct, 6, lim.MaxString); err != nil {
			return err
		}
		if m.Ctx.Lane, err = bytesField(&ct, 8, lim.MaxString); err != nil {
			return err
		}
		m.Ctx.PolicyVersion = c.PolicyVersion()
		m.Ctx.QoS = c.Qos()
		m.Ctx.DeadlineMS = c.DeadlineMs()
	}

	m.Kind = r.BodyType()
	var t flatbuffers.Table
	if !r.Body(&t) {
		return fmt.Errorf("%w: request without a body", ErrMalformed)
	}
	switch m.Kind {
	case tcproto.RequestBodyHelloRequest:
		var b tcproto.HelloRequest
		b.Init(t.Bytes, t.Pos)
		m.ProtocolVersion = b.ProtocolVersion()
		m.Name, err = bytesField(&t, 6, lim.MaxString)
	case tcproto.RequestBodyPingRequest:
		m.Payload, err = bytesField(&t, 4, lim.MaxPayload)
	case tcproto.RequestBodyRegisterBufferRequest:
		var b tcproto.RegisterBufferRequest
		b.Init(t.Bytes, t.Pos)
		m.Size = b.Size()
	case tcproto.RequestBodyUnregisterBufferRequest:
		var b tcproto.UnregisterBufferRequest
		b.Init(t.Bytes, t.Pos)
		m.Segment = b.SegmentId()
	case tcproto.RequestBodyPoolInfoRequest, tcproto.RequestBodyStatsRequest:
	case tcproto.RequestBodyAllocBlocksRequest:
		var b tcproto.AllocBlocksRequest
		b.Init(t.Bytes, t.Pos)
		m.N = b.N()
		m.Size = b.Size()
		if int64(m.N) > int64(lim.MaxOffsets) {
			err = fmt.Errorf("%w: %d blocks (limit %d)", ErrLimit, m.N, lim.MaxOffsets)
		}
	case tcproto.RequestBodyFreeBlocksRequest:
		var b tcproto.FreeBlocksRequest
		b.Init(t.Bytes, t.Pos)
		var n int
		if n, err = vecLen(&t, 4, 8, lim.MaxOffsets); err == nil {
			for i := 0; i < n; i++ {
				m.Offsets = append(m.Offsets, b.Offsets(i))
			}
		}
	case tcproto.RequestBodyAllocBatchRequest:
		var b tcproto.AllocBatchRequest
		b.Init(t.Bytes, t.Pos)
		m.Capacity = b.Capacity()
	case tcproto.RequestBodySubmitRequest:
		var b tcproto.SubmitRequest
		b.Init(t.Bytes, t.Pos)
		m.Batch = b.BatchId()
		if err = decodeTransfers(&t, 6, lim, m); err == nil {
			err = decodeNotify(&t, 8, m)
		}
	case tcproto.RequestBodyTaskStatusRequest:
		var b tcproto.TaskStatusRequest
		b.Init(t.Bytes, t.Pos)
		m.Batch = b.BatchId()
		m.Index = b.Index()
	case tcproto.RequestBodyBatchStatusRequest:
		var b tcproto.BatchStatusRequest
		b.Init(t.Bytes, t.Pos)
		m.Batch = b.BatchId()
	case tcproto.RequestBodyWaitRequest:
		var b tcproto.WaitRequest
		b.Init(t.Bytes, t.Pos)
		m.Batch = b.BatchId()
		m.TimeoutMS = b.TimeoutMs()
	case tcproto.RequestBodyFreeBatchRequest:
		var b tcproto.FreeBatchRequest
		b.Init(t.Bytes, t.Pos)
		m.Batch = b.BatchId()
	case tcproto.RequestBodyTransferRequestBody:
		var b tcproto.TransferRequestBody
		b.Init(t.Bytes, t.Pos)
		m.TimeoutMS = b.TimeoutMs()
		if err = decodeTransfers(&t, 4, lim, m); err == nil {
			err = decodeNotify(&t, 8, m)
		}
	case tcproto.RequestBodyRegisterFileRequest:
		var b tcproto.RegisterFileRequest
		b.Init(t.Bytes, t.Pos)
		m.Direct = b.Direct()
		m.Size = b.Size()
		m.Name, err = bytesField(&t, 4, lim.MaxPath)
		if err == nil && len(m.Name) == 0 {
			err = fmt.Errorf("%w: empty path", ErrMalformed)
		}
	case tcproto.RequestBodyExportSegmentRequest:
		var b tcproto.ExportSegmentRequest
		b.Init(t.Bytes, t.Pos)
		m.Segment, m.Offset, m.Length, m.Rights = b.SegmentId(), b.Offset(), b.Length(), b.Rights()
		m.Name, err = nameField(&t, 4, lim)
	case tcproto.RequestBodyUnexportSegmentRequest, tcproto.RequestBodySubscribeRequest:
		m.Name, err = nameField(&t, 4, lim)
	case tcproto.RequestBodyOpenRemoteRequest:
		var b tcproto.OpenRemoteRequest
		b.Init(t.Bytes, t.Pos)
		m.Rights, m.Transport = b.Rights(), uint8(b.Transport())
		m.Name, err = nameField(&t, 4, lim)
	case tcproto.RequestBodyCloseRemoteRequest:
		var b tcproto.CloseRemoteRequest
		b.Init(t.Bytes, t.Pos)
		m.Segment = b.SegmentId()
	case tcproto.RequestBodyPollNotificationsRequest:
		var b tcproto.PollNotificationsRequest
		b.Init(t.Bytes, t.Pos)
		m.TimeoutMS, m.Max = b.TimeoutMs(), b.Max()
	case tcproto.RequestBodyPeersRequest, tcproto.RequestBodySegmentsRequest, tcproto.RequestBodyRdmaRequest:
	default:
		return fmt.Errorf("%w: unknown request body %d", ErrMalformed, m.Kind)
	}
	return err
}

// maxName bounds a segment name on the wire: "peer/segment" is at most a
// 64-byte daemon id, a slash and a 255-byte segment name.
const maxName = 64 + 1 + 255

// nameField reads a required segment name.
func nameField(t *flatbuffers.Table, slot flatbuffers.VOffsetT, lim DecodeLimits) ([]byte, error) {
	name, err := bytesField(t, slot, min(maxName, lim.MaxPath))
	if err == nil && len(name) == 0 {
		err = fmt.Errorf("%w: empty name", ErrMalformed)
	}
	return name, err
}

// decodeNotify reads the optional positional notify vector: empty, or one
// entry per transfer request, each payload at most MaxNotify bytes.
func decodeNotify(t *flatbuffers.Table, slot flatbuffers.VOffsetT, m *Request) error {
	err := decodeTables(t, slot, len(m.Requests), func(tab flatbuffers.Table) error {
		p, err := bytesField(&tab, 4, MaxNotify)
		if err != nil {
			return err
		}
		m.Notify = append(m.Notify, p)
		return nil
	})
	if err != nil {
		return err
	}
	if n := len(m.Notify); n != 0 && n != len(m.Requests) {
		return fmt.Errorf("%w: %d notify entries for %d requests", ErrMalformed, n, len(m.Requests))
	}
	return nil
}

func decodeTransfers(t *flatbuffers.Table, slot flatbuffers.VOffsetT, lim DecodeLimits, m *Request) error {
	n, start, err := vecAt(t, slot, transferRequestSize, lim.MaxRequests)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: no transfer requests", ErrMalformed)
	}
	var tr tcproto.TransferRequest
	for i := 0; i < n; i++ {
		tr.Init(t.Bytes, start+flatbuffers.UOffsetT(i*transferRequestSize))
		m.Requests = append(m.Requests, xfer.Request{
			Op:           xfer.Op(tr.Op()),
			Local:        xfer.SegmentID(tr.Local()),
			LocalOffset:  tr.LocalOffset(),
			Target:       xfer.SegmentID(tr.Target()),
			TargetOffset: tr.TargetOffset(),
			Length:       tr.Length(),
		})
	}
	return nil
}

// DecodeResponse decodes one frame body (without its length prefix) into m,
// with the same checks as DecodeRequest. Clients use it.
func DecodeResponse(buf []byte, lim DecodeLimits, m *Response) (err error) {
	defer recoverMalformed(&err)
	lim = lim.withDefaults()
	root, err := checkRoot(buf)
	if err != nil {
		return err
	}
	var r tcproto.Response
	r.Init(buf, root)
	rt := r.Table()
	*m = Response{Offsets: m.Offsets[:0], Codes: m.Codes[:0], States: m.States[:0], BlockClasses: m.BlockClasses[:0],
		Pool: m.Pool[:0], Engine: m.Engine[:0], Conn: m.Conn[:0], Transports: m.Transports[:0], Notifications: m.Notifications[:0],
		Peers: m.Peers[:0], Segments: m.Segments[:0]}
	m.Status = r.Status()
	m.RequestID = r.RequestId()
	if m.Message, err = bytesField(&rt, 6, lim.MaxString); err != nil {
		return err
	}
	m.Kind = r.BodyType()
	var t flatbuffers.Table
	if !r.Body(&t) {
		if m.Kind != tcproto.ResponseBodyNONE {
			return fmt.Errorf("%w: body type without a body", ErrMalformed)
		}
		return nil
	}
	switch m.Kind {
	case tcproto.ResponseBodyHelloResponse:
		var b tcproto.HelloResponse
		b.Init(t.Bytes, t.Pos)
		m.ProtocolVersion = b.ProtocolVersion()
		if m.DaemonID, err = bytesField(&t, 6, lim.MaxString); err != nil {
			return err
		}
		if m.Version, err = bytesField(&t, 8, lim.MaxString); err != nil {
			return err
		}
		if m.PeerAddr, err = bytesField(&t, 12, lim.MaxString); err != nil {
			return err
		}
		var l tcproto.Limits
		if b.Limits(&l) != nil {
			m.Limits = LimitsInfo{l.MaxFrame(), l.MaxBuffers(), l.MaxBlocks(), l.MaxBatches(),
				l.MaxBatchCapacity(), l.MaxRequests(), l.MaxIdempotencyKeys()}
		}
	case tcproto.ResponseBodyPingResponse:
		m.Payload, err = bytesField(&t, 4, lim.MaxPayload)
	case tcproto.ResponseBodyRegisterBufferResponse:
		var b tcproto.RegisterBufferResponse
		b.Init(t.Bytes, t.Pos)
		m.Segment = b.SegmentId()
	case tcproto.ResponseBodyUnregisterBufferResponse, tcproto.ResponseBodyFreeBatchResponse:
	case tcproto.ResponseBodyPoolInfoResponse:
		var b tcproto.PoolInfoResponse
		b.Init(t.Bytes, t.Pos)
		m.Segment, m.Size = b.SegmentId(), b.Size()
		var n int
		if n, err = vecLen(&t, 8, 8, lim.MaxCounters); err == nil {
			for i := 0; i < n; i++ {
				m.BlockClasses = append(m.BlockClasses, b.BlockClasses(i))
			}
		}
	case tcproto.ResponseBodyAllocBlocksResponse:
		var b tcproto.AllocBlocksResponse
		b.Init(t.Bytes, t.Pos)
		var n int
		if n, err = vecLen(&t, 4, 8, lim.MaxOffsets); err == nil {
			for i := 0; i < n; i++ {
				m.Offsets = append(m.Offsets, b.Offsets(i))
			}
		}
	case tcproto.ResponseBodyFreeBlocksResponse:
		var b tcproto.FreeBlocksResponse
		b.Init(t.Bytes, t.Pos)
		err = decodeCodes(&t, 4, lim.MaxOffsets, m, b.Codes)
	case tcproto.ResponseBodyAllocBatchResponse:
		var b tcproto.AllocBatchResponse
		b.Init(t.Bytes, t.Pos)
		m.Batch = b.BatchId()
	case tcproto.ResponseBodySubmitResponse:
		var b tcproto.SubmitResponse
		b.Init(t.Bytes, t.Pos)
		err = decodeCodes(&t, 4, lim.MaxRequests, m, b.Codes)
	case tcproto.ResponseBodyTaskStatusResponse:
		var b tcproto.TaskStatusResponse
		b.Init(t.Bytes, t.Pos)
		m.Task = TaskInfo{State: b.State(), Transferred: b.Transferred(), Code: b.Code()}
	case tcproto.ResponseBodyBatchStatusResponse:
		var b tcproto.BatchStatusResponse
		b.Init(t.Bytes, t.Pos)
		var s tcproto.BatchSummary
		if b.Summary(&s) != nil {
			m.Summary = summaryOf(&s)
		}
	case tcproto.ResponseBodyWaitResponse:
		var b tcproto.WaitResponse
		b.Init(t.Bytes, t.Pos)
		var s tcproto.BatchSummary
		if b.Summary(&s) != nil {
			m.Summary = summaryOf(&s)
		}
	case tcproto.ResponseBodyTransferResponse:
		var b tcproto.TransferResponse
		b.Init(t.Bytes, t.Pos)
		if err = decodeCodes(&t, 4, lim.MaxRequests, m, b.Codes); err != nil {
			return err
		}
		var n int
		if n, err = vecLen(&t, 6, 1, lim.MaxRequests); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			m.States = append(m.States, b.States(i))
		}
		var s tcproto.BatchSummary
		if b.Summary(&s) != nil {
			m.Summary = summaryOf(&s)
		}
	case tcproto.ResponseBodyStatsResponse:
		var b tcproto.StatsResponse
		b.Init(t.Bytes, t.Pos)
		m.Connections = b.Connections()
		if m.Pool, err = decodeCounters(&t, 4, lim, m.Pool, b.Pool); err != nil {
			return err
		}
		if m.Engine, err = decodeCounters(&t, 6, lim, m.Engine, b.Engine); err != nil {
			return err
		}
		if m.Conn, err = decodeCounters(&t, 10, lim, m.Conn, b.Connection); err != nil {
			return err
		}
		m.Transports, err = decodeCounters(&t, 12, lim, m.Transports, b.Transports)
	case tcproto.ResponseBodyRegisterFileResponse:
		var b tcproto.RegisterFileResponse
		b.Init(t.Bytes, t.Pos)
		m.Segment, m.Size = b.SegmentId(), b.Size()
	case tcproto.ResponseBodyExportSegmentResponse:
		var b tcproto.ExportSegmentResponse
		b.Init(t.Bytes, t.Pos)
		m.Size = b.Size()
	case tcproto.ResponseBodyUnexportSegmentResponse, tcproto.ResponseBodyCloseRemoteResponse,
		tcproto.ResponseBodySubscribeResponse:
	case tcproto.ResponseBodyOpenRemoteResponse:
		var b tcproto.OpenRemoteResponse
		b.Init(t.Bytes, t.Pos)
		m.Segment, m.Size, m.Epoch = b.SegmentId(), b.Size(), b.Epoch()
	case tcproto.ResponseBodyPollNotificationsResponse:
		err = decodeTables(&t, 4, lim.MaxItems, func(tab flatbuffers.Table) error {
			var nf Notification
			var err error
			if nf.Segment, err = bytesField(&tab, 4, maxName); err != nil {
				return err
			}
			if nf.Payload, err = bytesField(&tab, 6, MaxNotify); err != nil {
				return err
			}
			m.Notifications = append(m.Notifications, nf)
			return nil
		})
	case tcproto.ResponseBodyPeersResponse:
		err = decodeTables(&t, 4, lim.MaxItems, func(tab flatbuffers.Table) error {
			var b tcproto.PeerInfo
			b.Init(tab.Bytes, tab.Pos)
			p := PeerInfo{Epoch: b.Epoch(), Connected: b.Connected(), BytesIn: b.BytesIn(), BytesOut: b.BytesOut(), Errors: b.Errors()}
			var err error
			if p.ID, err = bytesField(&tab, 4, lim.MaxString); err != nil {
				return err
			}
			if p.Addr, err = bytesField(&tab, 6, lim.MaxString); err != nil {
				return err
			}
			m.Peers = append(m.Peers, p)
			return nil
		})
	case tcproto.ResponseBodySegmentsResponse:
		err = decodeTables(&t, 4, lim.MaxItems, func(tab flatbuffers.Table) error {
			var b tcproto.SegmentInfo
			b.Init(tab.Bytes, tab.Pos)
			si := SegmentInfo{Segment: b.SegmentId(), Size: b.Size(), Rights: b.Rights(), Epoch: b.Epoch(), Transport: uint8(b.Transport())}
			var err error
			if si.Name, err = bytesField(&tab, 4, maxName); err != nil {
				return err
			}
			if si.Peer, err = bytesField(&tab, 6, lim.MaxString); err != nil {
				return err
			}
			m.Segments = append(m.Segments, si)
			return nil
		})
	case tcproto.ResponseBodyRdmaResponse:
		err = decodeRDMA(&t, lim, &m.RDMA)
	default:
		return fmt.Errorf("%w: unknown response body %d", ErrMalformed, m.Kind)
	}
	return err
}

func summaryOf(s *tcproto.BatchSummary) Summary {
	return Summary{s.Total(), s.Waiting(), s.Pending(), s.Completed(), s.Failed(), s.Timeout(), s.Canceled(), s.Transferred()}
}

func decodeCodes(t *flatbuffers.Table, slot flatbuffers.VOffsetT, limit int, m *Response, at func(int) Code) error {
	n, err := vecLen(t, slot, 1, limit)
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		m.Codes = append(m.Codes, at(i))
	}
	return nil
}

func decodeCounters(t *flatbuffers.Table, slot flatbuffers.VOffsetT, lim DecodeLimits, dst []Counter,
	at func(*tcproto.Counter, int) bool) ([]Counter, error) {
	n, err := vecLen(t, slot, 4, lim.MaxCounters)
	if err != nil {
		return dst, err
	}
	var c tcproto.Counter
	for i := 0; i < n; i++ {
		at(&c, i)
		ct := c.Table()
		name, err := bytesField(&ct, 4, lim.MaxString)
		if err != nil {
			return dst, err
		}
		dst = append(dst, Counter{Name: string(name), Value: c.Value()})
	}
	return dst, nil
}

// decodeTables walks the vector of tables at slot, checked against limit,
// calling fn with each element's table.
func decodeTables(t *flatbuffers.Table, slot flatbuffers.VOffsetT, limit int, fn func(flatbuffers.Table) error) error {
	n, start, err := vecAt(t, slot, 4, limit)
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		pos := start + flatbuffers.UOffsetT(i*4)
		tab := flatbuffers.Table{Bytes: t.Bytes, Pos: flatbuffers.GetUOffsetT(t.Bytes[pos:]) + pos}
		if err := fn(tab); err != nil {
			return err
		}
	}
	return nil
}
