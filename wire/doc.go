// Package wire is tensorcast's control protocol as bytes: the messages a
// client and tensorcastd exchange over the unix socket, and their one codec.
// Both the daemon's server (control/) and the clients use it; it holds no
// server code.
//
// A frame is a u32 little-endian length (FrameHeader bytes) followed by one
// flatbuffer of fbs/control.fbs: a Request from the client, a Response from
// the daemon. A Request is a Context and one body, a Response a status, a
// short message and one body (none when the status is not OK).
//
// Each body is a Go struct named after its table in the schema
// (PingRequest, OpenQueueResponse, RDMAResponse for RdmaResponse), in the file of its call
// (session.go, segments.go, batch.go, peers.go, rdma.go, queue.go,
// directory.go, store.go). Beside
// it are its Kind (the union tag) and its fields method, which lists each
// field once with its slot and its limit; the one list both encodes and
// decodes it (fields.go). A call is registered by one line in registry.go.
// Adding a message is: append its table to the schema's union, make
// generate, write its struct, Kind and fields, and register it. A reader of
// a request switches on its body's type:
//
//	switch m := req.Body.(type) {
//	case *wire.PingRequest:
//		wire.SetResponse[wire.PingResponse](&resp).Payload = m.Payload
//	}
//
// DecodeRequest and DecodeResponse are the only readers of outside bytes.
// They check every offset, length and count against the frame and the
// DecodeLimits before use and turn a bounds-check panic on a malformed
// buffer (the Go flatbuffers runtime has no verifier) into ErrMalformed.
// Decoding reuses the bodies of earlier decodes into the same Request or
// Response and their slices, so the steady state allocates nothing; byte
// slices in a decoded message alias the frame.
package wire
