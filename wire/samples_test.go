package wire

import (
	"bytes"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// sampleCtx sets every field of the context.
var sampleCtx = Context{RequestID: 7, IdempotencyKey: []byte("key-1"), Lane: []byte("stream-first"),
	PolicyVersion: 3, QoS: 2, DeadlineMS: 1500}

var sampleTransfers = []xfer.Request{
	{Op: xfer.OpWrite, Local: 5, LocalOffset: 64, Target: 1, TargetOffset: 8192, Length: 4096},
	{Op: xfer.OpRead, Local: 5, LocalOffset: 0, Target: 1, TargetOffset: 0, Length: 1},
}

// sampleRequests is a request of every kind with every field set. The
// first 28 are, in order, the messages of testdata/frames/req-*.
func sampleRequests() []Request {
	with := func(b RequestBody) Request { return Request{Ctx: sampleCtx, Body: b} }
	return []Request{
		with(&HelloRequest{ProtocolVersion: 1, ClientName: []byte("engine-0")}),
		with(&PingRequest{Payload: []byte("abcdefgh")}),
		with(&RegisterBufferRequest{Size: 1 << 30}),
		with(&UnregisterBufferRequest{Segment: 9}),
		with(&PoolInfoRequest{}),
		with(&AllocBlocksRequest{N: 4, Size: 65536}),
		with(&FreeBlocksRequest{Offsets: []uint64{0, 4096, 1 << 40}}),
		with(&AllocBatchRequest{Capacity: 128}),
		with(&SubmitRequest{Batch: 1<<32 | 5, Requests: sampleTransfers}),
		with(&TaskStatusRequest{Batch: 77, Index: 3}),
		with(&BatchStatusRequest{Batch: 77}),
		with(&WaitRequest{Batch: 77, TimeoutMS: 250}),
		with(&FreeBatchRequest{Batch: 77}),
		with(&TransferRequestBody{Requests: sampleTransfers, TimeoutMS: 100}),
		with(&StatsRequest{}),
		with(&RegisterFileRequest{Path: []byte("/data/kv.bin"), Direct: true, Size: 1 << 20}),
		with(&SubmitRequest{Batch: 78, Requests: sampleTransfers, Notify: [][]byte{[]byte("layer 3"), nil}}),
		with(&TransferRequestBody{Requests: sampleTransfers, TimeoutMS: 9, Notify: [][]byte{nil, []byte("x")}}),
		with(&ExportSegmentRequest{Name: []byte("kvpool"), Segment: 1, Offset: 4096, Length: 1 << 20, Rights: RightRead | RightWrite}),
		with(&UnexportSegmentRequest{Name: []byte("kvpool")}),
		with(&OpenRemoteRequest{Name: []byte("decode-1/kvpool"), Rights: RightWrite}),
		with(&CloseRemoteRequest{Segment: 12}),
		with(&SubscribeRequest{Name: []byte("kvpool")}),
		with(&PollNotificationsRequest{TimeoutMS: 50, Max: 16}),
		with(&PeersRequest{}),
		with(&SegmentsRequest{}),
		with(&RDMARequest{}),
		{Ctx: Context{RequestID: 3}, Body: &OpenRemoteRequest{Name: []byte("decode-1/kvpool"), Rights: RightRead | RightWrite,
			Transport: TransportRDMA}},
		with(&OpenQueueRequest{SQEntries: 256, CQEntries: 512, DataSize: 1 << 20}),
		with(&CloseQueueRequest{Queue: 1<<40 | 3}),
		with(&DirectoryRequest{}),
		with(&StorePutRequest{Keys: sampleKeys, Values: sampleExtents, Durable: true}),
		with(&StoreReadRequest{Keys: sampleKeys, Dests: sampleExtents}),
		with(&StoreRemoveRequest{Keys: sampleKeys}),
		with(&StorePinRequest{Keys: sampleKeys, TTLMS: 30000}),
		with(&StoreUnpinRequest{Keys: sampleKeys}),
		with(&StoreReserveRequest{Keys: sampleKeys, Sizes: []uint64{4096, 1 << 20, 7}}),
		with(&StoreCommitRequest{Keys: sampleKeys, Durable: true}),
		with(&StoreStatRequest{Key: []byte("blk/7")}),
		with(&StoreListRequest{Prefix: []byte("blk/"), After: []byte("blk/3"), Max: 100}),
		with(&StoreFlushRequest{TimeoutMS: 5000}),
		with(&StoreRemoveRequest{Keys: [][]byte{{}, []byte("x")}}),
		with(&StoreAbortRequest{Keys: sampleKeys}),
		with(&HandleIssueRequest{Keys: sampleKeys, TTLMS: 60000}),
		with(&HandleRenewRequest{Token: bytes.Repeat([]byte{0xa5}, 158), TTLMS: 30000}),
		with(&HandleReleaseRequest{Token: []byte{1, 2, 3}}),
		with(&LeaseCreateRequest{OpID: []byte("op-7f3a"), Keys: sampleKeys, TTLMS: 10000}),
		with(&LeaseReleaseRequest{OpID: []byte("op-7f3a")}),
		with(&ModeRequest{Set: "global-governed"}),
		with(&ModeRequest{}),
		with(&ClusterLocateRequest{Key: []byte("prefix/0007")}),
		with(&ClusterShardsRequest{First: 1024, Count: 512}),
		with(&ClusterShardsRequest{}),
		with(&ExportSegmentRequest{Name: []byte("shared"), Segment: 1, Rights: RightRead, Grants: []string{"team-b", "team-c"}}),
	}
}

// sampleKeys are a store call's keys: an ordinary one, a 256-byte one and
// one of binary bytes.
var sampleKeys = [][]byte{[]byte("model-a/blk/00ff"), bytes.Repeat([]byte("k"), 256), {0, 1, 2, 0xff}}

var sampleExtents = []Extent{{Segment: 5, Offset: 0, Length: 4096}, {Segment: 1, Offset: 1 << 30, Length: 1 << 20}, {Segment: 5, Offset: 8, Length: 7}}

func sampleSummary() Summary {
	return Summary{Total: 9, Waiting: 1, Pending: 2, Completed: 3, Failed: 1, Timeout: 1, Canceled: 1, Transferred: 1 << 33}
}

func sampleRDMA() *RDMAResponse {
	return &RDMAResponse{State: RDMAEnabled, Device: "rxe0", Port: 1, GID: "::ffff:10.0.2.15", GIDIndex: 1, MTU: 1024, LID: 7,
		PoolRegistered: 64 << 20, PoolMRs: 1, Peers: []RDMAPeer{
			{ID: "d1", Transport: "rdma", Link: "up", Epoch: 0x1234, QueuePairs: 2, Segments: 3, Accepting: true, AcceptedEpoch: 0x99},
			{ID: "d3", Transport: "tcp", Link: "failed"},
		}}
}

func sampleDirectory() *DirectoryResponse {
	return &DirectoryResponse{Backend: "etcd", State: "up", SinceUnixMS: 1_700_000_000_123, Outages: 2,
		Endpoints: []string{"http://10.0.0.1:2379", "http://10.0.0.2:2379"}, Prefix: "/tensorcast/", BudgetMS: 2000,
		LeaseTTLMS: 10000, Self: "d1", Epoch: 0xabc,
		Cache: DirectoryCache{Lookups: 100, Hits: 96, NotFound: 1, FallbackStore: 3, FallbackPeer: 1, Unavailable: 1,
			Corrections: 1, StoreReads: 3, Dropped: 4, AgeMS: 120, Synced: true, Revision: 77, Members: 2, Exports: 5,
			StoreRequests: 900},
		Members: []DirectoryMember{
			{ID: "d1", Epoch: 0xabc, Addr: "10.0.0.1:7400", Caps: []string{"tcp", "notify", "rdma"}, Self: true, AgeMS: 120,
				LeaseLeftMS: 9000, LeaseKnown: true},
			{ID: "d2", Epoch: 0xdef, Addr: "10.0.0.2:7400", Caps: []string{"tcp"}, AgeMS: 130},
		},
		MembersTotal: 3, Published: 4, Pending: 1}
}

// sampleResponses is a response of every kind with every field set. The
// first 29 are, in order, the messages of testdata/frames/resp-*.
func sampleResponses() []Response {
	limits := LimitsInfo{1, 2, 3, 4, 5, 6, 7}
	sum := sampleSummary()
	return []Response{
		{RequestID: 1, Body: &HelloResponse{ProtocolVersion: 1, DaemonID: []byte("d"), Version: []byte("v"), Limits: limits}},
		{RequestID: 1, Body: &HelloResponse{ProtocolVersion: 1, DaemonID: []byte("d"), Version: []byte("v"), Limits: limits,
			PeerAddr: []byte("127.0.0.1:7400")}},
		{RequestID: 2, Body: &PoolInfoResponse{Segment: 1, Size: 1 << 30, BlockClasses: []uint64{4096, 8192}}},
		{RequestID: 3, Body: &AllocBlocksResponse{Offsets: []uint64{0, 4096}}},
		{RequestID: 4, Body: &SubmitResponse{Codes: []Code{tcproto.CodeOK, tcproto.CodeNOT_FOUND}}},
		{RequestID: 5, Body: &TaskStatusResponse{State: tcproto.TaskStateCOMPLETED, Transferred: 4096, Code: tcproto.CodeOK}},
		{RequestID: 6, Body: &TransferResponse{Codes: []Code{0, 8},
			States: []tcproto.TaskState{tcproto.TaskStateCOMPLETED, tcproto.TaskStateTIMEOUT}, Summary: sum}},
		{RequestID: 7, Body: &StatsResponse{Pool: []Counter{{"used", 5}}, Engine: []Counter{{"bytes", 9}},
			Connection: []Counter{{"blocks", 2}}, Transports: []Counter{{"uring.ring0.entries", 256}}, Connections: 3}},
		{RequestID: 8, Status: tcproto.CodeBUSY, Message: []byte("busy")},
		{RequestID: 9, Body: &OpenRemoteResponse{Segment: 14, Size: 1 << 30, Epoch: 0xfeed}},
		{RequestID: 10, Body: &ExportSegmentResponse{Size: 4096}},
		{RequestID: 11, Body: &PollNotificationsResponse{
			Notifications: []Notification{{[]byte("kv"), []byte("p1")}, {[]byte("kv2"), []byte("p2")}}}},
		{RequestID: 12, Body: &PeersResponse{Peers: []PeerInfo{
			{ID: []byte("d2"), Addr: []byte("127.0.0.1:7400"), Epoch: 5, Connected: true, BytesIn: 1, BytesOut: 2, Errors: 3}}}},
		{RequestID: 13, Body: &SegmentsResponse{Segments: []SegmentInfo{
			{Name: []byte("kv"), Segment: 3, Size: 8, Rights: 3},
			{Name: []byte("kv"), Peer: []byte("d2"), Segment: 15, Size: 9, Rights: 1, Epoch: 7, Transport: 2}}}},
		{RequestID: 14, Body: sampleRDMA()},
		{RequestID: 15, Body: &RDMAResponse{State: RDMAOff, Reason: "rdma = off"}},
		{RequestID: 16, Body: &RegisterBufferResponse{Segment: 77}},
		{RequestID: 17, Body: &UnregisterBufferResponse{}},
		{RequestID: 18, Body: &FreeBlocksResponse{Codes: []Code{0, 2, 4}}},
		{RequestID: 19, Body: &AllocBatchResponse{Batch: 1<<32 | 3}},
		{RequestID: 20, Body: &BatchStatusResponse{Summary: sum}},
		{RequestID: 21, Body: &WaitResponse{Summary: sum}},
		{RequestID: 22, Body: &FreeBatchResponse{}},
		{RequestID: 23, Body: &RegisterFileResponse{Segment: 5, Size: 1 << 20}},
		{RequestID: 24, Body: &UnexportSegmentResponse{}},
		{RequestID: 25, Body: &CloseRemoteResponse{}},
		{RequestID: 26, Body: &SubscribeResponse{}},
		{RequestID: 27, Body: &PingResponse{Payload: []byte("abcdefgh")}},
		{RequestID: 28, Body: &StatsResponse{Connections: 1}},
		{RequestID: 29, Body: &OpenQueueResponse{Queue: 1<<40 | 3, SQEntries: 256, CQEntries: 512, DataSize: 1 << 20, Size: 3 << 20}},
		{RequestID: 30, Body: &CloseQueueResponse{}},
		{RequestID: 31, Body: sampleDirectory()},
		{RequestID: 32, Body: &DirectoryResponse{Backend: "embedded", State: "static", Self: "d1",
			Members: []DirectoryMember{{ID: "d1", Self: true}, {ID: "d2", Addr: "10.0.0.2:7400"}}, MembersTotal: 2}},
		{RequestID: 33, Body: &StorePutResponse{Codes: []Code{0, 3, 4}}},
		{RequestID: 34, Body: &StoreReadResponse{Codes: []Code{0, 2, 1}, Lengths: []uint64{4096, 0, 1 << 21}}},
		{RequestID: 35, Body: &StoreRemoveResponse{Codes: []Code{0, 6}}},
		{RequestID: 36, Body: &StorePinResponse{Codes: []Code{6, 2}}},
		{RequestID: 37, Body: &StoreUnpinResponse{Codes: []Code{0}}},
		{RequestID: 38, Body: &StoreReserveResponse{Codes: []Code{0, 5}, Offsets: []uint64{1 << 22, 0}}},
		{RequestID: 39, Body: &StoreCommitResponse{Codes: []Code{0, 0, 4}}},
		{RequestID: 40, Body: &StoreStatResponse{Info: StoreKeyInfo{Size: 1 << 18, InL1: true, InL2: true, Pins: 3, Dirty: false, Tombstone: true}}},
		{RequestID: 41, Body: &StoreListResponse{Keys: []StoreKeyInfo{
			{Key: []byte("blk/4"), Size: 4096, InL1: true, Dirty: true},
			{Key: []byte("blk/5"), Size: 1, InL2: true, Pins: 1 << 20}}, More: true}},
		{RequestID: 42, Body: &StoreFlushResponse{}},
		{RequestID: 43, Body: &StatsResponse{Connections: 2, Store: []Counter{{"keys", 12}, {"l2_bytes", 1 << 30}}}},
		{RequestID: 44, Body: &StoreAbortResponse{Codes: []Code{0, 6, 4}}},
		{RequestID: 45, Body: &HandleIssueResponse{Token: bytes.Repeat([]byte{0x5a}, 158), HandleID: 1 << 40, ExpiryUnixMS: 1_700_000_060_000}},
		{RequestID: 46, Body: &HandleRenewResponse{Token: []byte{9, 8}, ExpiryUnixMS: 1_700_000_090_000}},
		{RequestID: 47, Body: &HandleReleaseResponse{}},
		{RequestID: 48, Body: &LeaseCreateResponse{ExpiryUnixMS: 1_700_000_010_000, Joined: true}},
		{RequestID: 49, Body: &LeaseReleaseResponse{}},
		{RequestID: 50, Body: &ModeResponse{Mode: "budgeted-hybrid", RemoteGets: 256, ServeBytesPerSec: 8 << 30,
			RemoteGetsInFlight: 3, GetsRefused: 4, ServesRefused: 5}},
		{RequestID: 51, Body: &ClusterLocateResponse{Shard: 713, Home: "d2", Generation: 0x1234,
			Holders: []string{"d1", "d3"}, HolderEpochs: []uint64{9, 10}, HolderTiers: []uint8{1, 2},
			HolderSizes: []uint64{4096, 1 << 20}, HolderCRCs: []uint32{0xdeadbeef, 7}}},
		{RequestID: 52, Body: &ClusterLocateResponse{Shard: 1, Home: "d1", Generation: 5}},
		{RequestID: 53, Body: &ClusterShardsResponse{ShardsTotal: 4, First: 1, HomeIDs: []string{"d1", "d2"},
			Homes: []uint16{0, 1, NoHome}, Generations: []uint64{7, 9, 0}, Rendezvous: []uint16{0, 1, 1}, Keys: []uint32{12, 0, 0},
			ClaimHolders: []string{"d2"}, ClaimCounts: []uint32{3}, ClaimsOutstanding: 3, Holds: 2, Fenced: true}},
		{RequestID: 54, Body: &ClusterShardsResponse{ShardsTotal: 1024}},
	}
}
