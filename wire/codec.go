package wire

import (
	"encoding/binary"
	"fmt"

	flatbuffers "github.com/google/flatbuffers/go"
)

// EncodeRequest builds m into b (which it resets) and returns the whole
// frame: the u32 little-endian length followed by the flatbuffer. The
// returned slice aliases b's buffer and is valid until b is used again.
func EncodeRequest(b *flatbuffers.Builder, m *Request) []byte { return encodeFrame(b, &m.codec, m) }

// DecodeRequest decodes one frame body (without its length prefix) into m.
// It is the only place the daemon reads a request's flatbuffer: it checks
// every offset, length and count against the frame and lim before use, and
// turns a bounds-check panic of the flatbuffers runtime into ErrMalformed.
// On error m is left in an unspecified state, but for one case: an error
// that matches ErrLimit and not ErrMalformed is a whole frame with a count
// or length over lim (the field over it was not read), and m.Ctx.RequestID
// is the request's id (0 when the frame carries none), so the daemon can
// refuse that call alone and go on reading the connection. m's bodies and
// slices are reused; its byte slices alias buf.
func DecodeRequest(buf []byte, lim DecodeLimits, m *Request) error {
	m.Ctx.RequestID = 0
	if err := decodeFrame(buf, lim, &m.codec, m); err != nil {
		return err
	}
	if m.Body == nil {
		return fmt.Errorf("%w: request without a body", ErrMalformed)
	}
	return nil
}

// EncodeResponse builds m into b (which it resets) and returns the whole
// frame, length prefix included. The slice aliases b's buffer.
func EncodeResponse(b *flatbuffers.Builder, m *Response) []byte { return encodeFrame(b, &m.codec, m) }

// DecodeResponse decodes one frame body (without its length prefix) into m,
// with the same checks as DecodeRequest; a response may have no body.
// Clients use it.
func DecodeResponse(buf []byte, lim DecodeLimits, m *Response) error {
	return decodeFrame(buf, lim, &m.codec, m)
}

func encodeFrame(b *flatbuffers.Builder, f *fields, root table) []byte {
	b.Reset()
	b.FinishSizePrefixed(f.encode(root, b))
	return b.FinishedBytes()
}

func decodeFrame(buf []byte, lim DecodeLimits, f *fields, root table) (err error) {
	defer recoverMalformed(&err)
	pos, err := checkRoot(buf)
	if err != nil {
		return err
	}
	return f.decode(root, flatbuffers.Table{Bytes: buf, Pos: pos}, lim.withDefaults())
}

// EncodeBody builds m's body alone into b (which it resets) and returns its
// bytes: equal bodies give equal bytes, so the daemon compares the
// arguments of idempotent retries by them. The slice aliases b's buffer.
func EncodeBody(b *flatbuffers.Builder, m *Request) []byte {
	b.Reset()
	if m.Body != nil {
		b.Finish(m.codec.encode(m.Body, b))
	}
	return b.FinishedBytes()
}

// minTable is the smallest buffer that can hold a root offset and a table.
const minTable = 8

// checkRoot validates the root offset before any generated accessor
// touches it.
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

// recoverMalformed turns a panic of the generated accessors (a bounds check
// on a malformed buffer) into ErrMalformed.
func recoverMalformed(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: %v", ErrMalformed, r)
	}
}

// vecAt reads the length of the vector at vtable offset vt of tab and
// checks it, and the bytes it spans, before any element is read; it
// returns the length and where the elements start (0, 0 when the field is
// absent).
func vecAt(tab *flatbuffers.Table, vt flatbuffers.VOffsetT, elem, limit int) (int, flatbuffers.UOffsetT, error) {
	o := flatbuffers.UOffsetT(tab.Offset(vt))
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

// bytesField returns the byte vector or string at vtable offset vt of tab,
// checked against limit; nil when absent or empty.
func bytesField(tab *flatbuffers.Table, vt flatbuffers.VOffsetT, limit int) ([]byte, error) {
	n, start, err := vecAt(tab, vt, 1, limit)
	if err != nil || n == 0 {
		return nil, err
	}
	end := start + flatbuffers.UOffsetT(n)
	return tab.Bytes[start:end:end], nil
}
