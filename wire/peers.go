package wire

import "github.com/tensorcast/tensorcast/fbs/tcproto"

// ExportSegmentRequest makes [Offset, Offset+Length) of Segment (a buffer
// of the connection, Length 0 = to its end, or the pool, within blocks it
// holds) reachable by peers as Name, with Rights: by the clients of the
// exporter's tenant on peer daemons, and by those of the tenants Grants
// names.
type ExportSegmentRequest struct {
	Name                    []byte // required, at most MaxName bytes
	Segment, Offset, Length uint64
	Rights                  uint8    // RightRead | RightWrite
	Grants                  []string // at most MaxGrants tenants, each at most MaxTenant bytes
}

func (*ExportSegmentRequest) Kind() RequestKind { return tcproto.RequestBodyExportSegmentRequest }

func (m *ExportSegmentRequest) fields(f *fields) {
	name(f, 0, &m.Name)
	scalar(f, 1, &m.Segment)
	scalar(f, 2, &m.Offset)
	scalar(f, 3, &m.Length)
	scalar(f, 4, &m.Rights)
	texts(f, 5, &m.Grants, MaxGrants, MaxTenant)
}

// ExportSegmentResponse is the exported size.
type ExportSegmentResponse struct{ Size uint64 }

func (*ExportSegmentResponse) Kind() ResponseKind { return tcproto.ResponseBodyExportSegmentResponse }

func (m *ExportSegmentResponse) fields(f *fields) { scalar(f, 0, &m.Size) }

// UnexportSegmentRequest ends the connection's export Name.
type UnexportSegmentRequest struct{ Name []byte }

func (*UnexportSegmentRequest) Kind() RequestKind { return tcproto.RequestBodyUnexportSegmentRequest }

func (m *UnexportSegmentRequest) fields(f *fields) { name(f, 0, &m.Name) }

// UnexportSegmentResponse says the export ended.
type UnexportSegmentResponse struct{ noFields }

func (*UnexportSegmentResponse) Kind() ResponseKind {
	return tcproto.ResponseBodyUnexportSegmentResponse
}

// OpenRemoteRequest opens Name ("peer/segment") with Rights; Transport
// (TransportAuto, TransportTCP, TransportRDMA) says how its requests travel.
type OpenRemoteRequest struct {
	Name      []byte // required, at most MaxName bytes
	Rights    uint8
	Transport uint8
}

func (*OpenRemoteRequest) Kind() RequestKind { return tcproto.RequestBodyOpenRemoteRequest }

func (m *OpenRemoteRequest) fields(f *fields) {
	name(f, 0, &m.Name)
	scalar(f, 1, &m.Rights)
	scalar(f, 2, &m.Transport)
}

// OpenRemoteResponse names the remote segment for requests (Segment), its
// size and the peer's epoch it was opened at.
type OpenRemoteResponse struct{ Segment, Size, Epoch uint64 }

func (*OpenRemoteResponse) Kind() ResponseKind { return tcproto.ResponseBodyOpenRemoteResponse }

func (m *OpenRemoteResponse) fields(f *fields) {
	scalar(f, 0, &m.Segment)
	scalar(f, 1, &m.Size)
	scalar(f, 2, &m.Epoch)
}

// CloseRemoteRequest closes a remote segment the connection opened.
type CloseRemoteRequest struct{ Segment uint64 }

func (*CloseRemoteRequest) Kind() RequestKind { return tcproto.RequestBodyCloseRemoteRequest }

func (m *CloseRemoteRequest) fields(f *fields) { scalar(f, 0, &m.Segment) }

// CloseRemoteResponse says the remote segment is closed.
type CloseRemoteResponse struct{ noFields }

func (*CloseRemoteResponse) Kind() ResponseKind { return tcproto.ResponseBodyCloseRemoteResponse }

// SubscribeRequest makes the connection receive the notifications peers
// attach to WRITEs into the segment exported as Name.
type SubscribeRequest struct{ Name []byte }

func (*SubscribeRequest) Kind() RequestKind { return tcproto.RequestBodySubscribeRequest }

func (m *SubscribeRequest) fields(f *fields) { name(f, 0, &m.Name) }

// SubscribeResponse says the subscription holds.
type SubscribeResponse struct{ noFields }

func (*SubscribeResponse) Kind() ResponseKind { return tcproto.ResponseBodySubscribeResponse }

// PollNotificationsRequest takes up to Max queued notifications, waiting up
// to TimeoutMS for one.
type PollNotificationsRequest struct{ TimeoutMS, Max uint32 }

func (*PollNotificationsRequest) Kind() RequestKind {
	return tcproto.RequestBodyPollNotificationsRequest
}

func (m *PollNotificationsRequest) fields(f *fields) {
	scalar(f, 0, &m.TimeoutMS)
	scalar(f, 1, &m.Max)
}

// PollNotificationsResponse is the notifications taken, oldest first.
type PollNotificationsResponse struct{ Notifications []Notification }

func (*PollNotificationsResponse) Kind() ResponseKind {
	return tcproto.ResponseBodyPollNotificationsResponse
}

func (m *PollNotificationsResponse) fields(f *fields) { tables(f, 0, &m.Notifications, f.lim.MaxItems) }

// Notification is one notification a peer attached to a WRITE into an
// exported segment the connection subscribed to.
type Notification struct {
	Segment []byte
	Payload []byte
}

func (m *Notification) fields(f *fields) {
	text(f, 0, &m.Segment, MaxName)
	blob(f, 1, &m.Payload, MaxNotify)
}

// PeersRequest lists the peer daemons.
type PeersRequest struct{ noFields }

func (*PeersRequest) Kind() RequestKind { return tcproto.RequestBodyPeersRequest }

// PeersResponse is the known peers.
type PeersResponse struct{ Peers []PeerInfo }

func (*PeersResponse) Kind() ResponseKind { return tcproto.ResponseBodyPeersResponse }

func (m *PeersResponse) fields(f *fields) { tables(f, 0, &m.Peers, f.lim.MaxItems) }

// PeerInfo is one peer daemon as the daemon sees it.
type PeerInfo struct {
	ID, Addr          []byte
	Epoch             uint64
	Connected         bool
	BytesIn, BytesOut uint64
	Errors            uint64
}

func (m *PeerInfo) fields(f *fields) {
	text(f, 0, &m.ID, f.lim.MaxString)
	text(f, 1, &m.Addr, f.lim.MaxString)
	scalar(f, 2, &m.Epoch)
	flag(f, 3, &m.Connected)
	scalar(f, 4, &m.BytesIn)
	scalar(f, 5, &m.BytesOut)
	scalar(f, 6, &m.Errors)
}

// SegmentsRequest lists the segments the daemon exports and the remote
// ones its connections opened.
type SegmentsRequest struct{ noFields }

func (*SegmentsRequest) Kind() RequestKind { return tcproto.RequestBodySegmentsRequest }

// SegmentsResponse is the listing.
type SegmentsResponse struct{ Segments []SegmentInfo }

func (*SegmentsResponse) Kind() ResponseKind { return tcproto.ResponseBodySegmentsResponse }

func (m *SegmentsResponse) fields(f *fields) { tables(f, 0, &m.Segments, f.lim.MaxItems) }

// SegmentInfo is a segment the daemon exports (Peer empty) or a remote one
// opened through it (Peer set).
type SegmentInfo struct {
	Name, Peer []byte
	Segment    uint64
	Size       uint64
	Rights     uint8
	Epoch      uint64
	Transport  uint8    // remote segments: what OpenRemote asked for
	Grants     []string // exports: the other tenants it grants
}

func (m *SegmentInfo) fields(f *fields) {
	text(f, 0, &m.Name, MaxName)
	optText(f, 1, &m.Peer, f.lim.MaxString)
	scalar(f, 2, &m.Segment)
	scalar(f, 3, &m.Size)
	scalar(f, 4, &m.Rights)
	scalar(f, 5, &m.Epoch)
	scalar(f, 6, &m.Transport)
	texts(f, 7, &m.Grants, MaxGrants, MaxTenant)
}
