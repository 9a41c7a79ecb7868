package control

import (
	"encoding/binary"
	"fmt"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// ProtocolVersion is the control protocol version this package speaks.
const ProtocolVersion = 1

// FrameHeader is the size of a frame's length prefix (u32 little-endian).
const FrameHeader = 4

// DefaultMaxFrame is the default largest frame body, in bytes.
const DefaultMaxFrame = 1 << 20

// Code is the status of a call or of one item of a batch call.
type Code = tcproto.Code

// Kind names a request or response body.
type Kind = tcproto.RequestBody

// Context travels with every request. The byte slices alias the frame they
// were decoded from and are valid until the next decode into the same
// Request.
type Context struct {
	RequestID      uint64
	IdempotencyKey []byte
	Lane           []byte
	PolicyVersion  uint32
	QoS            uint8
	DeadlineMS     uint32
}

// Request is a decoded (or to-be-encoded) request. Only the fields of Kind's
// body are meaningful; slices are reused across decodes.
type Request struct {
	Ctx  Context
	Kind Kind

	ProtocolVersion uint32 // Hello
	Name            []byte // Hello: client name; RegisterFile: path
	Payload         []byte // Ping
	Size            uint64 // RegisterBuffer, AllocBlocks (block size), RegisterFile
	Segment         uint64 // UnregisterBuffer
	N               uint32 // AllocBlocks
	Offsets         []uint64
	Capacity        uint32 // AllocBatch
	Batch           uint64 // Submit, TaskStatus, BatchStatus, Wait, FreeBatch
	Index           uint32 // TaskStatus
	TimeoutMS       uint32 // Wait, Transfer
	Requests        []xfer.Request
	Direct          bool // RegisterFile
	// Notify is positional with Requests (Submit, Transfer): Notify[i] is
	// the notification riding on Requests[i], nil for none. Empty when the
	// call carries none.
	Notify [][]byte
	Offset uint64 // ExportSegment: start in the segment
	Length uint64 // ExportSegment: bytes (0 = to the end of a buffer)
	Rights uint8  // ExportSegment, OpenRemote: RightRead | RightWrite
	Max    uint32 // PollNotifications: most notifications to return
	// Transport is OpenRemote's TransportAuto, TransportTCP or
	// TransportRDMA.
	Transport uint8
}

// How requests to a remote segment travel (OpenRemote).
const (
	// TransportAuto: RDMA when both daemons have a usable device, else tcp.
	TransportAuto uint8 = 0
	// TransportTCP: always tcp.
	TransportTCP uint8 = 1
	// TransportRDMA: RDMA or a failed request, never tcp.
	TransportRDMA uint8 = 2
)

// Rights on a segment exported to peers or opened on one.
const (
	RightRead  uint8 = 1
	RightWrite uint8 = 2
)

// MaxNotify is the largest notification payload a WRITE may carry.
const MaxNotify = 4096

// Notification is one notification a peer attached to a WRITE into an
// exported segment this connection subscribed to.
type Notification struct {
	Segment []byte
	Payload []byte
}

// PeerInfo is one peer daemon as Peers reports it.
type PeerInfo struct {
	ID, Addr          []byte
	Epoch             uint64
	Connected         bool
	BytesIn, BytesOut uint64
	Errors            uint64
}

// SegmentInfo is an exported segment (Peer empty) or an opened remote one.
type SegmentInfo struct {
	Name, Peer []byte
	Segment    uint64
	Size       uint64
	Rights     uint8
	Epoch      uint64
	Transport  uint8 // remote segments: what OpenRemote asked for
}

// Counter is a named statistic.
type Counter struct {
	Name  string
	Value uint64
}

// Summary is a batch's task counts by state and its bytes moved.
type Summary struct {
	Total, Waiting, Pending, Completed, Failed, Timeout, Canceled uint32
	Transferred                                                   uint64
}

// LimitsInfo is what Hello tells a client about the server's limits.
type LimitsInfo struct {
	MaxFrame, MaxBuffers, MaxBlocks, MaxBatches, MaxBatchCapacity, MaxRequests, MaxIdempotencyKeys uint32
}

// TaskInfo is one task's status.
type TaskInfo struct {
	State       tcproto.TaskState
	Transferred uint64
	Code        Code
}

// Response is a decoded (or to-be-encoded) response. Only the fields of
// Kind's body are meaningful; slices are reused across decodes.
type Response struct {
	RequestID uint64
	Status    Code
	Message   []byte
	Kind      tcproto.ResponseBody

	ProtocolVersion uint32 // Hello
	DaemonID        []byte
	Version         []byte
	Limits          LimitsInfo
	PeerAddr        []byte   // Hello: the peer plane's address, empty without one
	Payload         []byte   // Ping
	Segment         uint64   // RegisterBuffer, PoolInfo, RegisterFile
	Size            uint64   // PoolInfo, RegisterFile
	BlockClasses    []uint64 // PoolInfo
	Offsets         []uint64 // AllocBlocks
	Codes           []Code   // FreeBlocks, Submit, Transfer
	States          []tcproto.TaskState
	Batch           uint64 // AllocBatch
	Task            TaskInfo
	Summary         Summary
	Pool            []Counter
	Engine          []Counter
	Conn            []Counter
	Transports      []Counter
	Connections     uint32
	Epoch           uint64 // OpenRemote
	Notifications   []Notification
	Peers           []PeerInfo
	Segments        []SegmentInfo
	RDMA            RDMAInfo // Rdma
}

// DecodeLimits bound every count and length a decoder accepts.
type DecodeLimits struct {
	MaxRequests int // transfer requests in one Submit or Transfer
	MaxOffsets  int // offsets in AllocBlocks/FreeBlocks, codes, states
	MaxString   int // idempotency key, lane, client name, message, ids
	MaxPath     int // RegisterFile path
	MaxPayload  int // Ping payload
	MaxCounters int // counters per stats group
	MaxItems    int // notifications, peers and segments in one response
}

// DefaultDecodeLimits are the limits used when a field is zero.
var DefaultDecodeLimits = DecodeLimits{
	MaxRequests: 4096,
	MaxOffsets:  65536,
	MaxString:   256,
	MaxPath:     4096,
	MaxPayload:  64 << 10,
	MaxCounters: 256,
	MaxItems:    65536,
}

func (l DecodeLimits) withDefaults() DecodeLimits {
	d := DefaultDecodeLimits
	if l.MaxRequests > 0 {
		d.MaxRequests = l.MaxRequests
	}
	if l.MaxOffsets > 0 {
		d.MaxOffsets = l.MaxOffsets
	}
	if l.MaxString > 0 {
		d.MaxString = l.MaxString
	}
	if l.MaxPath > 0 {
		d.MaxPath = l.MaxPath
	}
	if l.MaxPayload > 0 {
		d.MaxPayload = l.MaxPayload
	}
	if l.MaxCounters > 0 {
		d.MaxCounters = l.MaxCounters
	}
	if l.MaxItems > 0 {
		d.MaxItems = l.MaxItems
	}
	return d
}

// transferRequestSize is the wire size of one TransferRequest struct.
const transferRequestSize = 48

// minTable is the smallest buffer that can hold a root offset and a table.
const minTable = 8

// checkRoot validates the root offset and the root table's vtable position
// before any generated accessor touches them.
func checkRoot(buf []byte) (flatbuffers.UOffsetT, error) {
	if len(buf) < minTable {
		return 0, fmt.Errorf("%w: %d-byte buffer", ErrMalformed, len(buf))
	}
	root := binary.LittleEndian.Uint32(buf)
	if uint64(root)+4 > uint64(len(buf)) {
		return 0, fmt.Errorf("%w: root offset %d out of %d bytes", ErrMalformed, root, len(buf))
	}
	return flatbuffers.UOffsetT(root), nil
}

// vecLen reads the length of the vector at slot of tab and checks it, and
// the bytes it spans, before any element is read.
func vecLen(tab *flatbuffers.Table, slot flatbuffers.VOffsetT, elem, limit int) (int, error) {
	n, _, err := vecAt(tab, slot, elem, limit)
	return n, err
}

// vecAt is vecLen that also returns where the vector's elements start.
func vecAt(tab *flatbuffers.Table, slot flatbuffers.VOffsetT, elem, limit int) (int, flatbuffers.UOffsetT, error) {
	o := flatbuffers.UOffsetT(tab.Offset(slot))
	if o == 0 {
		return 0, 0, nil
	}
	start := tab.Vector(o)
	n := tab.VectorLen(o)
	if n < 0 || n > limit {
		return 0, 0, fmt.Errorf("%w: vector of %d elements (limit %d)", ErrLimit, n, limit)
	}
	if uint64(start)+uint64(n)*uint64(elem) > uint64(len(tab.Bytes)) {
		return 0, 0, fmt.Errorf("%w: vector past the end of the frame", ErrMalformed)
	}
	return n, start, nil
}

// bytesField returns the byte vector or string at slot, checked against limit.
func bytesField(tab *flatbuffers.Table, slot flatbuffers.VOffsetT, limit int) ([]byte, error) {
	n, err := vecLen(tab, slot, 1, limit)
	if err != nil || n == 0 {
		return nil, err
	}
	return tab.ByteVector(flatbuffers.UOffsetT(tab.Offset(slot)) + tab.Pos), nil
}

// recoverMalformed turns a panic of the generated accessors (a bounds check
// on a malformed buffer) into ErrMalformed.
func recoverMalformed(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: %v", ErrMalformed, r)
	}
}
