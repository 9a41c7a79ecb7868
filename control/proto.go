package control

// The one file of the server that speaks the generated flatbuffers code:
// the message kinds it treats apart, the codes it answers by itself, and
// the request id of a replayed answer. Everything else goes through
// package wire.

import (
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
)

// The codes the server answers without an error to map.
const (
	codeOK                 = tcproto.CodeOK
	codeInternal           = tcproto.CodeINTERNAL
	codeUnavailable        = tcproto.CodeUNAVAILABLE
	codeFailedPrecondition = tcproto.CodeFAILED_PRECONDITION
	codeDeadlineExceeded   = tcproto.CodeDEADLINE_EXCEEDED
)

// kindOpenQueue is OpenQueue's kind: mutating, but never idempotent by
// key (its answer passes an fd, which cannot be replayed).
const kindOpenQueue = tcproto.RequestBodyOpenQueueRequest

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
		tcproto.RequestBodyStoreAbortRequest,
		tcproto.RequestBodyHandleIssueRequest, tcproto.RequestBodyHandleRenewRequest, tcproto.RequestBodyHandleReleaseRequest,
		tcproto.RequestBodyLeaseCreateRequest, tcproto.RequestBodyLeaseReleaseRequest, tcproto.RequestBodyModeRequest:
		return true
	}
	return false
}

// tenantWide reports whether a mutating request's effect and answer are
// the tenant's, not the connection's: a retention handle or placement
// lease outlives the connection that asked for it, and its answer names
// nothing of that connection. Its idempotency record keeps the answer
// for any connection of the tenant (idem.go).
func tenantWide(k wire.RequestKind) bool {
	switch k {
	case tcproto.RequestBodyHandleIssueRequest, tcproto.RequestBodyHandleRenewRequest, tcproto.RequestBodyHandleReleaseRequest,
		tcproto.RequestBodyLeaseCreateRequest, tcproto.RequestBodyLeaseReleaseRequest:
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
		tcproto.RequestBodyStoreReserveRequest, tcproto.RequestBodyStoreCommitRequest, tcproto.RequestBodyStoreAbortRequest,
		tcproto.RequestBodyHandleRenewRequest: // a keep-alive, like a lease's: it changes no set of keys
		return true
	}
	return false
}

// kindName is the message name of request kind k, e.g. "SubmitRequest".
func kindName(k uint8) string {
	if name, ok := tcproto.EnumNamesRequestBody[tcproto.RequestBody(k)]; ok {
		return name
	}
	return "unknown"
}

// setRequestID sets the request id of the encoded answer frame (its
// length header first) in place. It reports false when the frame has no
// request id field to set: the answer was to request id 0, the default,
// which the encoding leaves out.
func setRequestID(frame []byte, id uint64) bool {
	return tcproto.GetRootAsResponse(frame[wire.FrameHeader:], 0).MutateRequestId(id)
}
