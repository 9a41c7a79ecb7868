package wire

import "github.com/tensorcast/tensorcast/fbs/tcproto"

// RDMAState says whether the daemon moves peer requests by RDMA.
type RDMAState = tcproto.RdmaState

// RDMA states: off (not asked to: rdma = off, or no peer plane),
// unavailable (asked to, but no device could be used) and enabled.
const (
	RDMAOff         = tcproto.RdmaStateOFF
	RDMAUnavailable = tcproto.RdmaStateUNAVAILABLE
	RDMAEnabled     = tcproto.RdmaStateENABLED
)

// MaxRDMAReason bounds the reason an RDMAResponse carries.
const MaxRDMAReason = 1024

// RDMARequest asks for the daemon's RDMA plane (the schema's RdmaRequest).
type RDMARequest struct{ noFields }

func (*RDMARequest) Kind() RequestKind { return tcproto.RequestBodyRdmaRequest }

// RDMAResponse is the daemon's RDMA plane (the schema's RdmaResponse): the
// device, port and GID in use with the pool's registration, or, when there
// is no plane, why. Its strings are copies: the answer outlives its frame.
type RDMAResponse struct {
	State RDMAState
	// Reason says why RDMA is off or unavailable; empty when enabled. At
	// most MaxRDMAReason bytes.
	Reason   string
	Device   string
	Port     uint32
	GID      string // address form ("::ffff:10.0.2.15")
	GIDIndex uint32
	MTU      uint32 // bytes
	LID      uint16
	// PoolRegistered is how many bytes of the pool are registered, in
	// PoolMRs memory regions.
	PoolRegistered uint64
	PoolMRs        uint32
	Peers          []RDMAPeer
}

func (*RDMAResponse) Kind() ResponseKind { return tcproto.ResponseBodyRdmaResponse }

func (m *RDMAResponse) fields(f *fields) {
	scalar(f, 0, &m.State)
	optText(f, 1, &m.Reason, MaxRDMAReason)
	optText(f, 2, &m.Device, f.lim.MaxString)
	scalar(f, 3, &m.Port)
	optText(f, 4, &m.GID, f.lim.MaxString)
	scalar(f, 5, &m.GIDIndex)
	scalar(f, 6, &m.MTU)
	scalar(f, 7, &m.LID)
	scalar(f, 8, &m.PoolRegistered)
	scalar(f, 9, &m.PoolMRs)
	optTables(f, 10, &m.Peers, f.lim.MaxItems)
}

// RDMAPeer is one peer as the RDMA plane sees it (the schema's RdmaPeer).
type RDMAPeer struct {
	ID string
	// Transport carries requests between the pool and the peer's
	// segments: "rdma" or "tcp".
	Transport string
	// Link is this daemon's link to the peer: "up", "failed" or "none".
	Link       string
	Epoch      uint64 // the peer's epoch the link was made with
	QueuePairs uint32 // the link's queue pairs
	Segments   uint32 // the peer's segments resolved for RDMA
	// Accepting says the peer's own link lands on a transport here, made
	// at AcceptedEpoch.
	Accepting     bool
	AcceptedEpoch uint64
}

func (m *RDMAPeer) fields(f *fields) {
	text(f, 0, &m.ID, f.lim.MaxString)
	text(f, 1, &m.Transport, f.lim.MaxString)
	text(f, 2, &m.Link, f.lim.MaxString)
	scalar(f, 3, &m.Epoch)
	scalar(f, 4, &m.QueuePairs)
	scalar(f, 5, &m.Segments)
	flag(f, 6, &m.Accepting)
	scalar(f, 7, &m.AcceptedEpoch)
}

// Fit cuts the answer to what encodes in about maxBytes: the reason to
// MaxRDMAReason bytes, then the peers past the budget (each counts its
// strings and a fixed overhead; the rest of the answer 256 bytes and its
// own strings). It returns how many peers it dropped.
func (m *RDMAResponse) Fit(maxBytes int) int {
	if len(m.Reason) > MaxRDMAReason {
		m.Reason = m.Reason[:MaxRDMAReason]
	}
	budget := maxBytes - 256 - len(m.Reason) - len(m.Device) - len(m.GID)
	for i, p := range m.Peers {
		budget -= len(p.ID) + len(p.Transport) + len(p.Link) + 96
		if budget < 0 {
			dropped := len(m.Peers) - i
			m.Peers = m.Peers[:i]
			return dropped
		}
	}
	return 0
}
