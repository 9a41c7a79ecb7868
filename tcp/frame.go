package tcp

import (
	"encoding/binary"
	"fmt"
)

// Wire format. Every frame starts with a fixed 32-byte little-endian header:
//
//	0  u16 magic (0x7443)      2  u8 version      3  u8 type
//	4  u16 flags               6  u16 status
//	8  u64 id (request id)     16 u64 arg (offset, or size)
//	24 u32 n (length)          28 u16 metaLen     30 u16 reserved (0)
//
// followed by metaLen bytes of metadata (handshake, token, reason) and, for
// WRITE requests and successful READ responses, n bytes of payload.
const (
	hdrLen       = 32
	frameMagic   = 0x7443
	frameVersion = 1
)

type frameType uint8

const (
	tHello      frameType = iota + 1 // client → server: hello
	tHelloReply                      // server → client: hello + server MAC
	tAuth                            // client → server: client MAC
	tAuthOK                          // server → client: session open
	tRefuse                          // either way: reason, then close
	tOpenReq                         // segment name, or the access (openMeta); flags = rights
	tOpenResp                        // status; arg = size; meta = token
	tReadReq                         // meta = token; arg = offset; n = length
	tReadResp                        // status; n bytes of payload when OK
	tWriteReq                        // meta = token; arg = offset; n bytes of payload
	tWriteResp                       // status; n = bytes written
	tNotify                          // meta = u16 token length, token, payload
	tNotifyAck                       // status
	tExchReq                         // arg = the peer's epoch expected (0: any); meta = kind (str8), request body
	tExchResp                        // status; meta = response body, or the reason when failed
	tMax
)

// Status codes carried by responses.
const (
	stOK uint16 = iota
	stPermission
	stInvalid
	stNotFound
	stFailed
)

// header is a decoded frame header.
type header struct {
	typ     frameType
	flags   uint16
	status  uint16
	id      uint64
	arg     uint64
	n       uint32
	metaLen uint16
}

// limits bounds what a decoded frame may claim.
type limits struct {
	maxPayload uint32 // n of READ/WRITE requests and responses
	maxMeta    uint16
}

// payloadLen is how many payload bytes follow the header and metadata.
func (h *header) payloadLen() uint32 {
	switch h.typ {
	case tWriteReq:
		return h.n
	case tReadResp, tExchResp:
		if h.status == stOK {
			return h.n
		}
	}
	return 0
}

func putHeader(b []byte, h *header) {
	_ = b[hdrLen-1]
	binary.LittleEndian.PutUint16(b[0:], frameMagic)
	b[2] = frameVersion
	b[3] = byte(h.typ)
	binary.LittleEndian.PutUint16(b[4:], h.flags)
	binary.LittleEndian.PutUint16(b[6:], h.status)
	binary.LittleEndian.PutUint64(b[8:], h.id)
	binary.LittleEndian.PutUint64(b[16:], h.arg)
	binary.LittleEndian.PutUint32(b[24:], h.n)
	binary.LittleEndian.PutUint16(b[28:], h.metaLen)
	binary.LittleEndian.PutUint16(b[30:], 0)
}

// decodeHeader is the one place frame headers from peers are decoded. It
// checks every field against the frame type and lim, and never panics.
func decodeHeader(b []byte, lim limits) (header, error) {
	var h header
	if len(b) < hdrLen {
		return h, fmt.Errorf("%w: short header (%d bytes)", ErrFrame, len(b))
	}
	if m := binary.LittleEndian.Uint16(b[0:]); m != frameMagic {
		return h, fmt.Errorf("%w: bad magic %#04x", ErrFrame, m)
	}
	if b[2] != frameVersion {
		return h, fmt.Errorf("%w: unsupported version %d", ErrFrame, b[2])
	}
	h.typ = frameType(b[3])
	h.flags = binary.LittleEndian.Uint16(b[4:])
	h.status = binary.LittleEndian.Uint16(b[6:])
	h.id = binary.LittleEndian.Uint64(b[8:])
	h.arg = binary.LittleEndian.Uint64(b[16:])
	h.n = binary.LittleEndian.Uint32(b[24:])
	h.metaLen = binary.LittleEndian.Uint16(b[28:])
	if r := binary.LittleEndian.Uint16(b[30:]); r != 0 {
		return h, fmt.Errorf("%w: reserved field %#x", ErrFrame, r)
	}
	if h.typ == 0 || h.typ >= tMax {
		return h, fmt.Errorf("%w: unknown type %d", ErrFrame, h.typ)
	}
	if h.metaLen > lim.maxMeta && h.typ != tExchReq && h.typ != tExchResp {
		return h, fmt.Errorf("%w: metadata of %d bytes exceeds %d", ErrFrame, h.metaLen, lim.maxMeta)
	}
	response := h.typ == tOpenResp || h.typ == tReadResp || h.typ == tWriteResp || h.typ == tNotifyAck || h.typ == tExchResp
	if !response && h.status != stOK {
		return h, fmt.Errorf("%w: status on a %d frame", ErrFrame, h.typ)
	}
	if response && h.status > stFailed {
		return h, fmt.Errorf("%w: unknown status %d", ErrFrame, h.status)
	}
	if h.typ != tOpenReq && h.flags != 0 {
		return h, fmt.Errorf("%w: flags on a %d frame", ErrFrame, h.typ)
	}
	switch h.typ {
	case tOpenReq:
		if h.flags == 0 || h.flags&^uint16(RightRead|RightWrite) != 0 {
			return h, fmt.Errorf("%w: bad rights %#x", ErrFrame, h.flags)
		}
		if h.metaLen == 0 {
			return h, fmt.Errorf("%w: open without a segment name", ErrFrame)
		}
	case tReadReq, tWriteReq:
		if h.n == 0 || h.n > lim.maxPayload {
			return h, fmt.Errorf("%w: length %d outside 1..%d", ErrFrame, h.n, lim.maxPayload)
		}
		if h.metaLen == 0 {
			return h, fmt.Errorf("%w: request without a token", ErrFrame)
		}
	case tReadResp, tWriteResp:
		if h.n > lim.maxPayload {
			return h, fmt.Errorf("%w: length %d exceeds %d", ErrFrame, h.n, lim.maxPayload)
		}
		if h.metaLen != 0 {
			return h, fmt.Errorf("%w: metadata on a response", ErrFrame)
		}
	case tHello, tHelloReply, tAuth, tNotify, tExchReq:
		if h.metaLen == 0 {
			return h, fmt.Errorf("%w: frame %d without metadata", ErrFrame, h.typ)
		}
	}
	if h.typ == tExchResp && h.n != 0 && (h.status != stOK || h.n > lim.maxPayload) {
		// A data exchange's payload (dataexch.go): only on an answer
		// that succeeded, bounded as a READ's.
		return h, fmt.Errorf("%w: payload of %d bytes on an exchange answer (status %d, at most %d)", ErrFrame, h.n, h.status, lim.maxPayload)
	}
	if h.typ != tReadReq && h.typ != tWriteReq && h.typ != tReadResp && h.typ != tWriteResp && h.typ != tExchResp && h.n != 0 {
		return h, fmt.Errorf("%w: length on a %d frame", ErrFrame, h.typ)
	}
	return h, nil
}

// reader is a bounds-checked cursor over metadata bytes. After the first
// short read every later read returns zero values and err stays set.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("%w: metadata truncated", ErrFrame)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8 {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

// str8 reads a string with a one-byte length of at most max bytes.
func (r *reader) str8(max int) string {
	n := int(r.u8())
	if r.err == nil && n > max {
		r.err = fmt.Errorf("%w: string of %d bytes exceeds %d", ErrFrame, n, max)
		return ""
	}
	return string(r.take(n))
}

// done fails if bytes are left over.
func (r *reader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d trailing metadata bytes", ErrFrame, len(r.b))
	}
	return r.err
}

func appendStr8(b []byte, s string) []byte {
	b = append(b, byte(len(s)))
	return append(b, s...)
}

// hello is what each side of a handshake says about itself.
type hello struct {
	id    string
	epoch uint64
	addr  string
	blob  []byte // opaque transport data (RDMA connection data later)
	// maxFrame and window are the largest payload this side accepts in a
	// frame and the bytes it lets one connection keep in flight; the
	// dialer sizes its slices and credit to fit them.
	maxFrame uint32
	window   uint64
	nonce    [32]byte
}

const (
	maxAddrLen = 128
	maxBlobLen = 1024
	macLen     = 32
)

func (h *hello) append(b []byte) []byte {
	b = appendStr8(b, h.id)
	b = binary.LittleEndian.AppendUint64(b, h.epoch)
	b = appendStr8(b, h.addr)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.blob)))
	b = append(b, h.blob...)
	b = binary.LittleEndian.AppendUint32(b, h.maxFrame)
	b = binary.LittleEndian.AppendUint64(b, h.window)
	return append(b, h.nonce[:]...)
}

// decodeHello parses a hello; withMAC also splits off a trailing MAC.
func decodeHello(meta []byte, withMAC bool) (h hello, mac []byte, err error) {
	body := meta
	if withMAC {
		if len(meta) < macLen {
			return h, nil, fmt.Errorf("%w: hello reply without MAC", ErrFrame)
		}
		body, mac = meta[:len(meta)-macLen], meta[len(meta)-macLen:]
	}
	r := reader{b: body}
	h.id = r.str8(maxIDLen)
	h.epoch = r.u64()
	h.addr = r.str8(maxAddrLen)
	bl := int(r.u16())
	if r.err == nil && bl > maxBlobLen {
		return h, nil, fmt.Errorf("%w: blob of %d bytes exceeds %d", ErrFrame, bl, maxBlobLen)
	}
	if v := r.take(bl); len(v) > 0 {
		h.blob = append([]byte(nil), v...)
	}
	if v := r.take(4); v != nil {
		h.maxFrame = binary.LittleEndian.Uint32(v)
	}
	h.window = r.u64()
	copy(h.nonce[:], r.take(32))
	if err := r.done(); err != nil {
		return h, nil, err
	}
	if h.id == "" || h.epoch == 0 {
		return h, nil, fmt.Errorf("%w: hello without id or epoch", ErrFrame)
	}
	if h.maxFrame < 4096 || h.window < uint64(h.maxFrame) {
		return h, nil, fmt.Errorf("%w: hello with frame limit %d and window %d", ErrFrame, h.maxFrame, h.window)
	}
	return h, mac, nil
}

// decodeNotify splits a notification's metadata into token and payload.
func decodeNotify(meta []byte) (tok, payload []byte, err error) {
	r := reader{b: meta}
	tl := int(r.u16())
	tok = r.take(tl)
	if r.err != nil {
		return nil, nil, r.err
	}
	if len(r.b) > MaxNotify {
		return nil, nil, fmt.Errorf("%w: notification of %d bytes exceeds %d", ErrFrame, len(r.b), MaxNotify)
	}
	return tok, r.b, nil
}

// parseFrame decodes one whole frame held in b (header, metadata and the
// structures inside the metadata), as the fuzz target drives it. The data
// path decodes the same pieces incrementally with the same functions.
func parseFrame(b []byte, lim limits) (header, error) {
	h, err := decodeHeader(b, lim)
	if err != nil {
		return h, err
	}
	rest := b[hdrLen:]
	if len(rest) < int(h.metaLen) {
		return h, fmt.Errorf("%w: metadata truncated", ErrFrame)
	}
	meta := rest[:h.metaLen]
	if uint64(len(rest)-int(h.metaLen)) != uint64(h.payloadLen()) {
		return h, fmt.Errorf("%w: payload is %d bytes, header says %d", ErrFrame, len(rest)-int(h.metaLen), h.payloadLen())
	}
	switch h.typ {
	case tHello:
		_, _, err = decodeHello(meta, false)
	case tHelloReply:
		_, _, err = decodeHello(meta, true)
	case tAuth:
		if len(meta) != macLen {
			err = fmt.Errorf("%w: auth MAC of %d bytes", ErrFrame, len(meta))
		}
	case tReadReq, tWriteReq, tOpenResp:
		if h.typ != tOpenResp || h.status == stOK {
			_, err = decodeToken(meta)
		}
	case tNotify:
		var tok []byte
		if tok, _, err = decodeNotify(meta); err == nil {
			_, err = decodeToken(tok)
		}
	case tOpenReq:
		_, err = decodeOpen(meta)
	case tExchReq:
		_, _, err = decodeExchange(meta)
	case tExchResp:
		if len(meta) > MaxExchange {
			err = fmt.Errorf("%w: exchange answer of %d bytes exceeds %d", ErrFrame, len(meta), MaxExchange)
		}
	}
	return h, err
}

// An open request's metadata is the segment's name for an access without
// tenants, as daemons before tenants send it; an access with tenants is
// openAccess (a byte no name starts with, as a name has no '/'), then
// the name, the asker's tenant and the export's tenant, each a str8. A
// daemon before tenants takes that for a name it does not export and
// answers not found: it cannot check tenants, so it does not serve them.
const openAccess = '/'

// encodeOpen is an open request's metadata for a.
func encodeOpen(a Access) []byte {
	if a.Tenant == "" && a.Owner == "" {
		return []byte(a.Name)
	}
	b := make([]byte, 0, 4+len(a.Name)+len(a.Tenant)+len(a.Owner))
	b = append(b, openAccess)
	b = appendStr8(b, a.Name)
	b = appendStr8(b, a.Tenant)
	return appendStr8(b, a.Owner)
}

// decodeOpen parses an open request's metadata (encodeOpen's).
func decodeOpen(meta []byte) (Access, error) {
	if len(meta) == 0 || meta[0] != openAccess {
		if len(meta) == 0 || len(meta) > maxNameLen {
			return Access{}, fmt.Errorf("%w: segment name of %d bytes", ErrFrame, len(meta))
		}
		return Access{Name: string(meta)}, nil
	}
	r := reader{b: meta[1:]}
	a := Access{Name: r.str8(maxNameLen), Tenant: r.str8(MaxTenant), Owner: r.str8(MaxTenant)}
	if err := r.done(); err != nil {
		return Access{}, err
	}
	if a.Name == "" || a.Tenant == "" && a.Owner == "" {
		return Access{}, fmt.Errorf("%w: open of %q with tenants %q and %q", ErrFrame, a.Name, a.Tenant, a.Owner)
	}
	return a, nil
}

// decodeExchange splits an exchange request's metadata into its kind and
// body.
func decodeExchange(meta []byte) (kind string, body []byte, err error) {
	r := reader{b: meta}
	kind = r.str8(MaxExchangeKind)
	if r.err != nil {
		return "", nil, r.err
	}
	if kind == "" {
		return "", nil, fmt.Errorf("%w: exchange without a kind", ErrFrame)
	}
	if len(r.b) > MaxExchange {
		return "", nil, fmt.Errorf("%w: exchange body of %d bytes exceeds %d", ErrFrame, len(r.b), MaxExchange)
	}
	return kind, r.b, nil
}
