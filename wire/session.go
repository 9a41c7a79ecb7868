package wire

import "github.com/tensorcast/tensorcast/fbs/tcproto"

// HelloRequest opens a session: the client's protocol version and name.
type HelloRequest struct {
	ProtocolVersion uint32
	ClientName      []byte
}

func (*HelloRequest) Kind() RequestKind { return tcproto.RequestBodyHelloRequest }

func (m *HelloRequest) fields(f *fields) {
	scalar(f, 0, &m.ProtocolVersion)
	text(f, 1, &m.ClientName, f.lim.MaxString)
}

// HelloResponse is the daemon's side of Hello.
type HelloResponse struct {
	ProtocolVersion uint32
	DaemonID        []byte
	Version         []byte
	Limits          LimitsInfo
	PeerAddr        []byte // where the daemon's peer plane listens; empty without one
}

func (*HelloResponse) Kind() ResponseKind { return tcproto.ResponseBodyHelloResponse }

func (m *HelloResponse) fields(f *fields) {
	scalar(f, 0, &m.ProtocolVersion)
	text(f, 1, &m.DaemonID, f.lim.MaxString)
	text(f, 2, &m.Version, f.lim.MaxString)
	nested(f, 3, &m.Limits)
	optText(f, 4, &m.PeerAddr, f.lim.MaxString)
}

// LimitsInfo is what Hello tells a client about the daemon's limits (the
// schema's Limits table).
type LimitsInfo struct {
	MaxFrame, MaxBuffers, MaxBlocks, MaxBatches, MaxBatchCapacity, MaxRequests, MaxIdempotencyKeys uint32
}

func (m *LimitsInfo) fields(f *fields) {
	for i, v := range [...]*uint32{&m.MaxFrame, &m.MaxBuffers, &m.MaxBlocks, &m.MaxBatches, &m.MaxBatchCapacity,
		&m.MaxRequests, &m.MaxIdempotencyKeys} {
		scalar(f, i, v)
	}
}

// PingRequest is a round trip that carries Payload there and back.
type PingRequest struct{ Payload []byte }

func (*PingRequest) Kind() RequestKind { return tcproto.RequestBodyPingRequest }

func (m *PingRequest) fields(f *fields) { blob(f, 0, &m.Payload, f.lim.MaxPayload) }

// PingResponse carries the request's payload back.
type PingResponse struct{ Payload []byte }

func (*PingResponse) Kind() ResponseKind { return tcproto.ResponseBodyPingResponse }

func (m *PingResponse) fields(f *fields) { blob(f, 0, &m.Payload, f.lim.MaxPayload) }

// StatsRequest asks for the daemon's counters.
type StatsRequest struct{ noFields }

func (*StatsRequest) Kind() RequestKind { return tcproto.RequestBodyStatsRequest }

// StatsResponse is the daemon's counters by group; a group without
// counters is left out.
type StatsResponse struct {
	Pool        []Counter
	Engine      []Counter
	Connections uint32
	Connection  []Counter // the asking connection's holdings
	Transports  []Counter // transports' features and counters
	Store       []Counter // the KV block store's figures; none without a store
}

func (*StatsResponse) Kind() ResponseKind { return tcproto.ResponseBodyStatsResponse }

func (m *StatsResponse) fields(f *fields) {
	optTables(f, 0, &m.Pool, f.lim.MaxCounters)
	optTables(f, 1, &m.Engine, f.lim.MaxCounters)
	scalar(f, 2, &m.Connections)
	optTables(f, 3, &m.Connection, f.lim.MaxCounters)
	optTables(f, 4, &m.Transports, f.lim.MaxCounters)
	optTables(f, 5, &m.Store, f.lim.MaxCounters)
}

// Counter is a named statistic; stats are lists of them so either side may
// add counters without a schema change. Its name is a copy: answers
// outlive their frame.
type Counter struct {
	Name  string
	Value uint64
}

func (m *Counter) fields(f *fields) {
	text(f, 0, &m.Name, f.lim.MaxString)
	scalar(f, 1, &m.Value)
}
