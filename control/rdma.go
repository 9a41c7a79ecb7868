package control

import (
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
)

// RDMAState says whether the daemon moves peer requests by RDMA.
type RDMAState = tcproto.RdmaState

// RDMA states: off (not asked to: rdma = off, or no peer plane),
// unavailable (asked to, but no device could be used) and enabled.
const (
	RDMAOff         = tcproto.RdmaStateOFF
	RDMAUnavailable = tcproto.RdmaStateUNAVAILABLE
	RDMAEnabled     = tcproto.RdmaStateENABLED
)

// MaxRDMAReason bounds the reason an Rdma answer carries; a longer one is
// cut.
const MaxRDMAReason = 1024

// RDMAInfo is the daemon's RDMA plane as the Rdma request reports it: the
// device, port and GID in use with the pool's registration, or, when there
// is no plane, why.
type RDMAInfo struct {
	State RDMAState
	// Reason says why RDMA is off or unavailable; empty when enabled.
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

// RDMAPeer is one peer as the RDMA plane sees it.
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

// RDMAReporter reports the daemon's RDMA plane, or why it has none. It is
// called once per Rdma request, from the connection's goroutine.
type RDMAReporter interface {
	RDMAInfo() RDMAInfo
}

// rdmaInfo answers Rdma. It never fails: without a reporter the answer is
// "off", with the reason.
func (c *conn) rdmaInfo() {
	c.resp.Kind = tcproto.ResponseBodyRdmaResponse
	r := c.s.deps.RDMA
	if r == nil {
		c.resp.RDMA = RDMAInfo{State: RDMAOff, Reason: "the daemon reports no RDMA plane"}
		return
	}
	info := r.RDMAInfo()
	if len(info.Reason) > MaxRDMAReason {
		info.Reason = info.Reason[:MaxRDMAReason]
	}
	// Keep the answer well inside a frame: drop peers past the budget.
	budget := c.s.cfg.MaxFrame/2 - 256 - len(info.Reason) - len(info.Device) - len(info.GID)
	for i, p := range info.Peers {
		budget -= len(p.ID) + len(p.Transport) + len(p.Link) + 96
		if budget < 0 {
			c.log.Warn("rdma answer cut short", "peers", len(info.Peers), "sent", i)
			info.Peers = info.Peers[:i]
			break
		}
	}
	c.resp.RDMA = info
}

// encodeRDMA builds an RdmaResponse body.
func encodeRDMA(b *flatbuffers.Builder, m *RDMAInfo) flatbuffers.UOffsetT {
	offs := make([]flatbuffers.UOffsetT, len(m.Peers))
	for i := range m.Peers {
		p := &m.Peers[i]
		id := b.CreateString(p.ID)
		tr := b.CreateString(p.Transport)
		link := b.CreateString(p.Link)
		tcproto.RdmaPeerStart(b)
		tcproto.RdmaPeerAddId(b, id)
		tcproto.RdmaPeerAddTransport(b, tr)
		tcproto.RdmaPeerAddLink(b, link)
		tcproto.RdmaPeerAddEpoch(b, p.Epoch)
		tcproto.RdmaPeerAddQueuePairs(b, p.QueuePairs)
		tcproto.RdmaPeerAddSegments(b, p.Segments)
		tcproto.RdmaPeerAddAccepting(b, p.Accepting)
		tcproto.RdmaPeerAddAcceptedEpoch(b, p.AcceptedEpoch)
		offs[i] = tcproto.RdmaPeerEnd(b)
	}
	var peers, reason, dev, gid flatbuffers.UOffsetT
	if len(offs) > 0 {
		peers = tableVector(b, offs)
	}
	if m.Reason != "" {
		reason = b.CreateString(m.Reason)
	}
	if m.Device != "" {
		dev = b.CreateString(m.Device)
	}
	if m.GID != "" {
		gid = b.CreateString(m.GID)
	}
	tcproto.RdmaResponseStart(b)
	tcproto.RdmaResponseAddState(b, m.State)
	if reason != 0 {
		tcproto.RdmaResponseAddReason(b, reason)
	}
	if dev != 0 {
		tcproto.RdmaResponseAddDevice(b, dev)
	}
	tcproto.RdmaResponseAddPort(b, m.Port)
	if gid != 0 {
		tcproto.RdmaResponseAddGid(b, gid)
	}
	tcproto.RdmaResponseAddGidIndex(b, m.GIDIndex)
	tcproto.RdmaResponseAddMtu(b, m.MTU)
	tcproto.RdmaResponseAddLid(b, m.LID)
	tcproto.RdmaResponseAddPoolRegistered(b, m.PoolRegistered)
	tcproto.RdmaResponseAddPoolMrs(b, m.PoolMRs)
	if peers != 0 {
		tcproto.RdmaResponseAddPeers(b, peers)
	}
	return tcproto.RdmaResponseEnd(b)
}

// decodeRDMA reads an RdmaResponse body (table t) into m, checking every
// string and the peer count against lim. Strings are copied: the answer
// outlives the frame.
func decodeRDMA(t *flatbuffers.Table, lim DecodeLimits, m *RDMAInfo) error {
	var b tcproto.RdmaResponse
	b.Init(t.Bytes, t.Pos)
	*m = RDMAInfo{State: b.State(), Port: b.Port(), GIDIndex: b.GidIndex(), MTU: b.Mtu(), LID: b.Lid(),
		PoolRegistered: b.PoolRegistered(), PoolMRs: b.PoolMrs()}
	for _, f := range []struct {
		slot  flatbuffers.VOffsetT
		limit int
		dst   *string
	}{{6, MaxRDMAReason, &m.Reason}, {8, lim.MaxString, &m.Device}, {12, lim.MaxString, &m.GID}} {
		s, err := bytesField(t, f.slot, f.limit)
		if err != nil {
			return err
		}
		*f.dst = string(s)
	}
	return decodeTables(t, 24, lim.MaxItems, func(tab flatbuffers.Table) error {
		var pb tcproto.RdmaPeer
		pb.Init(tab.Bytes, tab.Pos)
		p := RDMAPeer{Epoch: pb.Epoch(), QueuePairs: pb.QueuePairs(), Segments: pb.Segments(),
			Accepting: pb.Accepting(), AcceptedEpoch: pb.AcceptedEpoch()}
		for _, f := range []struct {
			slot flatbuffers.VOffsetT
			dst  *string
		}{{4, &p.ID}, {6, &p.Transport}, {8, &p.Link}} {
			s, err := bytesField(&tab, f.slot, lim.MaxString)
			if err != nil {
				return err
			}
			*f.dst = string(s)
		}
		m.Peers = append(m.Peers, p)
		return nil
	})
}
