package wire

import "github.com/tensorcast/tensorcast/fbs/tcproto"

// Retention handles, placement leases and the daemon's mode (seed 003) on
// the socket.

const (
	// MaxHandleToken is the longest retention handle token a message
	// carries (a token is shorter: see package grant).
	MaxHandleToken = 256
	// MaxOpID is the longest operation id of a placement lease.
	MaxOpID = 128
	// MaxModeName is the longest mode name.
	MaxModeName = 32
)

// HandleIssueRequest asks for a retention handle on Keys for TTLMS
// milliseconds: every key pinned, or none.
type HandleIssueRequest struct {
	Keys  [][]byte
	TTLMS uint32
}

func (*HandleIssueRequest) Kind() RequestKind { return tcproto.RequestBodyHandleIssueRequest }

func (m *HandleIssueRequest) fields(f *fields) {
	keyList(f, 0, &m.Keys)
	scalar(f, 1, &m.TTLMS)
}

// HandleIssueResponse is the handle's token, id and expiry.
type HandleIssueResponse struct {
	Token        []byte
	HandleID     uint64
	ExpiryUnixMS uint64
}

func (*HandleIssueResponse) Kind() ResponseKind { return tcproto.ResponseBodyHandleIssueResponse }

func (m *HandleIssueResponse) fields(f *fields) {
	blob(f, 0, &m.Token, MaxHandleToken)
	scalar(f, 1, &m.HandleID)
	scalar(f, 2, &m.ExpiryUnixMS)
}

// HandleRenewRequest extends the handle of Token to TTLMS milliseconds from
// now, at its issuer.
type HandleRenewRequest struct {
	Token []byte
	TTLMS uint32
}

func (*HandleRenewRequest) Kind() RequestKind { return tcproto.RequestBodyHandleRenewRequest }

func (m *HandleRenewRequest) fields(f *fields) {
	blob(f, 0, &m.Token, MaxHandleToken)
	scalar(f, 1, &m.TTLMS)
}

// HandleRenewResponse is the renewed handle's token and expiry.
type HandleRenewResponse struct {
	Token        []byte
	ExpiryUnixMS uint64
}

func (*HandleRenewResponse) Kind() ResponseKind { return tcproto.ResponseBodyHandleRenewResponse }

func (m *HandleRenewResponse) fields(f *fields) {
	blob(f, 0, &m.Token, MaxHandleToken)
	scalar(f, 1, &m.ExpiryUnixMS)
}

// HandleReleaseRequest gives back the pins of the handle of Token, at its
// issuer.
type HandleReleaseRequest struct{ Token []byte }

func (*HandleReleaseRequest) Kind() RequestKind { return tcproto.RequestBodyHandleReleaseRequest }

func (m *HandleReleaseRequest) fields(f *fields) { blob(f, 0, &m.Token, MaxHandleToken) }

// HandleReleaseResponse says the handle is released.
type HandleReleaseResponse struct{ noFields }

func (*HandleReleaseResponse) Kind() ResponseKind { return tcproto.ResponseBodyHandleReleaseResponse }

// LeaseCreateRequest pins Keys where they are for TTLMS milliseconds under
// operation id OpID (a retry with the same OpID and Keys joins).
type LeaseCreateRequest struct {
	OpID  []byte
	Keys  [][]byte
	TTLMS uint32
}

func (*LeaseCreateRequest) Kind() RequestKind { return tcproto.RequestBodyLeaseCreateRequest }

func (m *LeaseCreateRequest) fields(f *fields) {
	blob(f, 0, &m.OpID, MaxOpID)
	keyList(f, 1, &m.Keys)
	scalar(f, 2, &m.TTLMS)
}

// LeaseCreateResponse is the lease's expiry; Joined says an earlier create
// with the same operation id made it.
type LeaseCreateResponse struct {
	ExpiryUnixMS uint64
	Joined       bool
}

func (*LeaseCreateResponse) Kind() ResponseKind { return tcproto.ResponseBodyLeaseCreateResponse }

func (m *LeaseCreateResponse) fields(f *fields) {
	scalar(f, 0, &m.ExpiryUnixMS)
	flag(f, 1, &m.Joined)
}

// LeaseReleaseRequest gives back the pins of the lease of OpID.
type LeaseReleaseRequest struct{ OpID []byte }

func (*LeaseReleaseRequest) Kind() RequestKind { return tcproto.RequestBodyLeaseReleaseRequest }

func (m *LeaseReleaseRequest) fields(f *fields) { blob(f, 0, &m.OpID, MaxOpID) }

// LeaseReleaseResponse says the lease is released.
type LeaseReleaseResponse struct{ noFields }

func (*LeaseReleaseResponse) Kind() ResponseKind { return tcproto.ResponseBodyLeaseReleaseResponse }

// ModeRequest shows the daemon's mode, after changing it to Set when Set
// is not empty.
type ModeRequest struct{ Set string }

func (*ModeRequest) Kind() RequestKind { return tcproto.RequestBodyModeRequest }

func (m *ModeRequest) fields(f *fields) { optText(f, 0, &m.Set, MaxModeName) }

// ModeResponse is the mode, its budget (remote gets in flight; bytes per
// second served to other hosts, 0 for no bound) and the admission's
// counters.
type ModeResponse struct {
	Mode               string
	RemoteGets         uint32
	ServeBytesPerSec   uint64
	RemoteGetsInFlight uint32
	GetsRefused        uint64
	ServesRefused      uint64
}

func (*ModeResponse) Kind() ResponseKind { return tcproto.ResponseBodyModeResponse }

func (m *ModeResponse) fields(f *fields) {
	text(f, 0, &m.Mode, MaxModeName)
	scalar(f, 1, &m.RemoteGets)
	scalar(f, 2, &m.ServeBytesPerSec)
	scalar(f, 3, &m.RemoteGetsInFlight)
	scalar(f, 4, &m.GetsRefused)
	scalar(f, 5, &m.ServesRefused)
}
