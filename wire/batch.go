package wire

import (
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// AllocBatchRequest allocates a batch of up to Capacity tasks.
type AllocBatchRequest struct{ Capacity uint32 }

func (*AllocBatchRequest) Kind() RequestKind { return tcproto.RequestBodyAllocBatchRequest }

func (m *AllocBatchRequest) fields(f *fields) { scalar(f, 0, &m.Capacity) }

// AllocBatchResponse names the batch.
type AllocBatchResponse struct{ Batch uint64 }

func (*AllocBatchResponse) Kind() ResponseKind { return tcproto.ResponseBodyAllocBatchResponse }

func (m *AllocBatchResponse) fields(f *fields) { scalar(f, 0, &m.Batch) }

// SubmitRequest adds Requests to Batch. Notify, when not empty, is
// positional: Notify[i] (nil for none) rides on Requests[i].
type SubmitRequest struct {
	Batch    uint64
	Requests []xfer.Request // at least one, at most DecodeLimits.MaxRequests
	Notify   [][]byte       // empty or len(Requests), each at most MaxNotify bytes
}

func (*SubmitRequest) Kind() RequestKind { return tcproto.RequestBodySubmitRequest }

func (m *SubmitRequest) fields(f *fields) {
	scalar(f, 0, &m.Batch)
	transfers(f, 1, &m.Requests)
	notify(f, 2, &m.Notify, len(m.Requests))
}

// SubmitResponse has one code per request, positionally: OK for accepted.
type SubmitResponse struct{ Codes []Code }

func (*SubmitResponse) Kind() ResponseKind { return tcproto.ResponseBodySubmitResponse }

func (m *SubmitResponse) fields(f *fields) { list(f, 0, &m.Codes, f.lim.MaxRequests) }

// TaskStatusRequest asks for task Index of Batch.
type TaskStatusRequest struct {
	Batch uint64
	Index uint32
}

func (*TaskStatusRequest) Kind() RequestKind { return tcproto.RequestBodyTaskStatusRequest }

func (m *TaskStatusRequest) fields(f *fields) {
	scalar(f, 0, &m.Batch)
	scalar(f, 1, &m.Index)
}

// TaskStatusResponse is one task's state, bytes moved and, once it ended,
// its code.
type TaskStatusResponse struct {
	State       tcproto.TaskState
	Transferred uint64
	Code        Code
}

func (*TaskStatusResponse) Kind() ResponseKind { return tcproto.ResponseBodyTaskStatusResponse }

func (m *TaskStatusResponse) fields(f *fields) {
	scalar(f, 0, &m.State)
	scalar(f, 1, &m.Transferred)
	scalar(f, 2, &m.Code)
}

// Summary is a batch's task counts by state and its bytes moved (the
// schema's BatchSummary struct).
type Summary struct {
	Total, Waiting, Pending, Completed, Failed, Timeout, Canceled uint32
	Transferred                                                   uint64
}

// BatchStatusRequest asks for Batch's summary.
type BatchStatusRequest struct{ Batch uint64 }

func (*BatchStatusRequest) Kind() RequestKind { return tcproto.RequestBodyBatchStatusRequest }

func (m *BatchStatusRequest) fields(f *fields) { scalar(f, 0, &m.Batch) }

// BatchStatusResponse is the batch's summary.
type BatchStatusResponse struct{ Summary Summary }

func (*BatchStatusResponse) Kind() ResponseKind { return tcproto.ResponseBodyBatchStatusResponse }

func (m *BatchStatusResponse) fields(f *fields) { summary(f, 0, &m.Summary) }

// WaitRequest waits up to TimeoutMS (0: the context's deadline, else the
// daemon's default) for Batch's tasks to end.
type WaitRequest struct {
	Batch     uint64
	TimeoutMS uint32
}

func (*WaitRequest) Kind() RequestKind { return tcproto.RequestBodyWaitRequest }

func (m *WaitRequest) fields(f *fields) {
	scalar(f, 0, &m.Batch)
	scalar(f, 1, &m.TimeoutMS)
}

// WaitResponse is the batch's summary when the wait ended; Waiting+Pending
// > 0 means time ran out.
type WaitResponse struct{ Summary Summary }

func (*WaitResponse) Kind() ResponseKind { return tcproto.ResponseBodyWaitResponse }

func (m *WaitResponse) fields(f *fields) { summary(f, 0, &m.Summary) }

// FreeBatchRequest frees Batch; BUSY while tasks are live.
type FreeBatchRequest struct{ Batch uint64 }

func (*FreeBatchRequest) Kind() RequestKind { return tcproto.RequestBodyFreeBatchRequest }

func (m *FreeBatchRequest) fields(f *fields) { scalar(f, 0, &m.Batch) }

// FreeBatchResponse says the batch is gone.
type FreeBatchResponse struct{ noFields }

func (*FreeBatchResponse) Kind() ResponseKind { return tcproto.ResponseBodyFreeBatchResponse }

// TransferRequestBody is the one-shot call: the daemon allocates a batch,
// submits Requests, waits up to TimeoutMS (0: the context's deadline, else
// the daemon's default) and frees it. Notify is as SubmitRequest's.
type TransferRequestBody struct {
	Requests  []xfer.Request
	TimeoutMS uint32
	Notify    [][]byte
}

func (*TransferRequestBody) Kind() RequestKind { return tcproto.RequestBodyTransferRequestBody }

func (m *TransferRequestBody) fields(f *fields) {
	transfers(f, 0, &m.Requests)
	scalar(f, 1, &m.TimeoutMS)
	notify(f, 2, &m.Notify, len(m.Requests))
}

// TransferResponse has one code and one final state per request,
// positionally, and the batch's summary.
type TransferResponse struct {
	Codes   []Code
	States  []tcproto.TaskState
	Summary Summary
}

func (*TransferResponse) Kind() ResponseKind { return tcproto.ResponseBodyTransferResponse }

func (m *TransferResponse) fields(f *fields) {
	list(f, 0, &m.Codes, f.lim.MaxRequests)
	list(f, 1, &m.States, f.lim.MaxRequests)
	summary(f, 2, &m.Summary)
}
