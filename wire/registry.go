package wire

// The protocol's calls, one line each: a request and the body of its
// answer, indexed by their union tags. A message's tag comes from its Kind
// method, so a line cannot name the wrong tag; two messages with one tag
// stop the program at init.
var requests, responses = register(
	call[HelloRequest, HelloResponse], call[PingRequest, PingResponse], call[StatsRequest, StatsResponse],
	call[RegisterBufferRequest, RegisterBufferResponse], call[UnregisterBufferRequest, UnregisterBufferResponse],
	call[RegisterFileRequest, RegisterFileResponse], call[PoolInfoRequest, PoolInfoResponse],
	call[AllocBlocksRequest, AllocBlocksResponse], call[FreeBlocksRequest, FreeBlocksResponse],
	call[AllocBatchRequest, AllocBatchResponse], call[SubmitRequest, SubmitResponse],
	call[TaskStatusRequest, TaskStatusResponse], call[BatchStatusRequest, BatchStatusResponse],
	call[WaitRequest, WaitResponse], call[FreeBatchRequest, FreeBatchResponse],
	call[TransferRequestBody, TransferResponse],
	call[ExportSegmentRequest, ExportSegmentResponse], call[UnexportSegmentRequest, UnexportSegmentResponse],
	call[OpenRemoteRequest, OpenRemoteResponse], call[CloseRemoteRequest, CloseRemoteResponse],
	call[SubscribeRequest, SubscribeResponse], call[PollNotificationsRequest, PollNotificationsResponse],
	call[PeersRequest, PeersResponse], call[SegmentsRequest, SegmentsResponse],
	call[RDMARequest, RDMAResponse],
	call[OpenQueueRequest, OpenQueueResponse], call[CloseQueueRequest, CloseQueueResponse],
	call[DirectoryRequest, DirectoryResponse],
	call[StorePutRequest, StorePutResponse], call[StoreReadRequest, StoreReadResponse],
	call[StoreRemoveRequest, StoreRemoveResponse], call[StorePinRequest, StorePinResponse],
	call[StoreUnpinRequest, StoreUnpinResponse], call[StoreReserveRequest, StoreReserveResponse],
	call[StoreCommitRequest, StoreCommitResponse], call[StoreStatRequest, StoreStatResponse],
	call[StoreListRequest, StoreListResponse], call[StoreFlushRequest, StoreFlushResponse],
	call[StoreAbortRequest, StoreAbortResponse],
	call[HandleIssueRequest, HandleIssueResponse], call[HandleRenewRequest, HandleRenewResponse],
	call[HandleReleaseRequest, HandleReleaseResponse], call[LeaseCreateRequest, LeaseCreateResponse],
	call[LeaseReleaseRequest, LeaseReleaseResponse], call[ModeRequest, ModeResponse],
	call[ClusterLocateRequest, ClusterLocateResponse], call[ClusterShardsRequest, ClusterShardsResponse],
)

// maker makes the empty messages of one call.
type maker struct {
	req  func() RequestBody
	resp func() ResponseBody
}

func call[Q, R any, PQ interface {
	*Q
	RequestBody
}, PR interface {
	*R
	ResponseBody
}]() maker {
	return maker{func() RequestBody { return PQ(new(Q)) }, func() ResponseBody { return PR(new(R)) }}
}

// register indexes the makers of calls by the kinds of their messages.
func register(calls ...func() maker) (req []func() RequestBody, resp []func() ResponseBody) {
	for _, c := range calls {
		m := c()
		req = put(req, int(m.req().Kind()), m.req)
		resp = put(resp, int(m.resp().Kind()), m.resp)
	}
	return req, resp
}

func put[B any](byKind []func() B, k int, mk func() B) []func() B {
	if k == 0 {
		panic("wire: a message of kind NONE")
	}
	for len(byKind) <= k {
		byKind = append(byKind, nil)
	}
	if byKind[k] != nil {
		panic("wire: two messages of one kind")
	}
	byKind[k] = mk
	return byKind
}
