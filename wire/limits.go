package wire

import "time"

// ProtocolVersion is the control protocol version this package speaks.
const ProtocolVersion = 1

// FrameHeader is the size of a frame's length prefix (u32 little-endian).
const FrameHeader = 4

// DefaultMaxFrame is the default largest frame body, in bytes.
const DefaultMaxFrame = 1 << 20

// TimeoutGrace is how long past its timeout a Wait or Transfer may take to
// be answered: the daemon lets the engine end what is still live in
// Timeout. A client's read deadline allows for it.
const TimeoutGrace = 100 * time.Millisecond

// MaxNotify is the largest notification payload a WRITE may carry.
const MaxNotify = 4096

// MaxName bounds a segment name on the wire: "peer/tenant/segment" is at
// most a 64-byte daemon id, a slash, a 64-byte tenant, a slash and a
// 255-byte segment name.
const MaxName = 64 + 1 + MaxTenant + 1 + 255

// MaxTenant bounds a tenant's name; MaxGrants the tenants one export
// grants besides its own.
const (
	MaxTenant = 64
	MaxGrants = 16
)

// Rights on a segment exported to peers or opened on one.
const (
	RightRead  uint8 = 1
	RightWrite uint8 = 2
)

// How requests to a remote segment travel (OpenRemoteRequest.Transport,
// SegmentInfo.Transport).
const (
	// TransportAuto: RDMA when both daemons have a usable device, else tcp.
	TransportAuto uint8 = 0
	// TransportTCP: always tcp.
	TransportTCP uint8 = 1
	// TransportRDMA: RDMA or a failed request, never tcp.
	TransportRDMA uint8 = 2
)

// TransportName names a transport (TransportAuto, TransportTCP,
// TransportRDMA) for logs and listings.
func TransportName(t uint8) string {
	switch t {
	case TransportTCP:
		return "tcp"
	case TransportRDMA:
		return "rdma"
	}
	return "auto"
}

// DecodeLimits bound every count and length a decoder accepts. A zero field
// takes its value from DefaultDecodeLimits.
type DecodeLimits struct {
	MaxRequests int // transfer requests in one Submit or Transfer
	MaxOffsets  int // offsets in AllocBlocks/FreeBlocks, codes, states
	MaxString   int // idempotency key, lane, client name, message, ids
	MaxPath     int // RegisterFile path
	MaxPayload  int // Ping payload
	MaxCounters int // counters per stats group, pool block classes
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

// withDefaults fills l's zero (or negative) fields from DefaultDecodeLimits.
func (l DecodeLimits) withDefaults() DecodeLimits {
	d := DefaultDecodeLimits
	for _, f := range [...]struct{ set, dst *int }{
		{&l.MaxRequests, &d.MaxRequests}, {&l.MaxOffsets, &d.MaxOffsets}, {&l.MaxString, &d.MaxString},
		{&l.MaxPath, &d.MaxPath}, {&l.MaxPayload, &d.MaxPayload}, {&l.MaxCounters, &d.MaxCounters},
		{&l.MaxItems, &d.MaxItems},
	} {
		if *f.set > 0 {
			*f.dst = *f.set
		}
	}
	return d
}
