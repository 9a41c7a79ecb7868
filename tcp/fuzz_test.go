package tcp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var fuzzLimits = limits{maxPayload: 1 << 20, maxMeta: 8192}

// seedFrames are well-formed frames of every type plus near misses.
func seedFrames() [][]byte {
	frame := func(h header, meta, payload []byte) []byte {
		h.metaLen = uint16(len(meta))
		b := make([]byte, hdrLen)
		putHeader(b, &h)
		return append(append(b, meta...), payload...)
	}
	hl := hello{id: "alpha", epoch: 7, addr: "127.0.0.1:9000", blob: []byte{1, 2, 3}, maxFrame: 1 << 20, window: 4 << 20}
	tok := (&token{access: Access{Name: "kvpool"}, rights: RightRead | RightWrite, expiry: 1 << 62, issuer: "bravo", epoch: 9}).sign([]byte("k"))
	access := Access{Tenant: "B", Owner: "A", Name: "kvpool"}
	tok2 := (&token{access: access, rights: RightRead, expiry: 1 << 62, issuer: "bravo", epoch: 9}).sign([]byte("k"))
	notify := binary.LittleEndian.AppendUint16(nil, uint16(len(tok)))
	notify = append(append(notify, tok...), "ready"...)
	out := [][]byte{
		frame(header{typ: tHello}, hl.append(nil), nil),
		frame(header{typ: tHelloReply}, append(hl.append(nil), make([]byte, macLen)...), nil),
		frame(header{typ: tAuth}, make([]byte, macLen), nil),
		frame(header{typ: tAuthOK}, nil, nil),
		frame(header{typ: tRefuse}, []byte("stale epoch"), nil),
		frame(header{typ: tOpenReq, flags: uint16(RightRead)}, []byte("kvpool"), nil),
		frame(header{typ: tOpenResp, arg: 1 << 20}, tok, nil),
		frame(header{typ: tOpenResp, status: stNotFound}, nil, nil),
		frame(header{typ: tReadReq, id: 1, arg: 4096, n: 16}, tok, nil),
		frame(header{typ: tReadResp, id: 1, n: 16}, nil, bytes.Repeat([]byte{7}, 16)),
		frame(header{typ: tReadResp, id: 1, status: stPermission}, nil, nil),
		frame(header{typ: tWriteReq, id: 2, n: 8}, tok, []byte("payload!")),
		frame(header{typ: tWriteResp, id: 2, n: 8}, nil, nil),
		frame(header{typ: tNotify, id: 3}, notify, nil),
		frame(header{typ: tNotifyAck, id: 3, status: stFailed}, nil, nil),
		frame(header{typ: tOpenReq, flags: uint16(RightRead)}, encodeOpen(access), nil),
		frame(header{typ: tReadReq, id: 4, arg: 4096, n: 16}, tok2, nil),
	}
	// Near misses: oversized length, truncated metadata, trailing bytes.
	big := frame(header{typ: tReadReq, id: 1, n: 16}, tok, nil)
	binary.LittleEndian.PutUint32(big[24:], 1<<31)
	out = append(out, big, out[0][:hdrLen+5], append(append([]byte{}, out[12]...), 0))
	// An open with the access form and no tenant; a version 2 token
	// without tenants.
	noTenants := appendStr8(appendStr8(appendStr8([]byte{openAccess}, "kvpool"), ""), "")
	v2 := (&token{access: Access{Name: "kvpool"}, rights: RightRead, expiry: 1 << 62, issuer: "bravo", epoch: 9}).body(nil)
	v2 = append(append([]byte{tokenV2}, v2[1:]...), 0, 0)
	v2 = append(v2, make([]byte, macLen)...)
	out = append(out, frame(header{typ: tOpenReq, flags: uint16(RightRead)}, noTenants, nil),
		frame(header{typ: tReadReq, id: 5, arg: 0, n: 16}, v2, nil))
	return out
}

// exchangeSeedFrames are well-formed exchange frames and near misses.
func exchangeSeedFrames() (good, bad [][]byte) {
	frame := func(h header, meta []byte) []byte {
		h.metaLen = uint16(len(meta))
		b := make([]byte, hdrLen)
		putHeader(b, &h)
		return append(b, meta...)
	}
	req := append(appendStr8(nil, "rdma.connect"), "TCRQ\x01body"...)
	good = [][]byte{
		frame(header{typ: tExchReq, id: 5}, req),
		frame(header{typ: tExchReq, id: 6}, append(appendStr8(nil, "k"), make([]byte, MaxExchange)...)),
		frame(header{typ: tExchResp, id: 5}, []byte("answer")),
		frame(header{typ: tExchResp, id: 5, status: stNotFound}, nil),
		frame(header{typ: tExchResp, id: 6, status: stFailed}, []byte("busy")),
		append(frame(header{typ: tExchResp, id: 7, n: 4}, []byte("answer")), "data"...), // a data exchange's payload
	}
	bad = [][]byte{
		frame(header{typ: tExchReq, id: 5}, nil),                                                          // no kind
		frame(header{typ: tExchReq, id: 5}, []byte{0, 'x'}),                                               // empty kind
		frame(header{typ: tExchReq, id: 5}, []byte{10, 'a', 'b'}),                                         // kind truncated
		frame(header{typ: tExchReq, id: 5}, append(appendStr8(nil, strings.Repeat("k", 65)), 'x')),        // kind too long
		frame(header{typ: tExchReq, id: 5}, append(appendStr8(nil, "k"), make([]byte, MaxExchange+1)...)), // body too big
		frame(header{typ: tExchReq, id: 5, status: stFailed}, req),                                        // status on a request
		frame(header{typ: tExchResp, id: 5, status: stFailed + 1}, nil),                                   // unknown status
		frame(header{typ: tExchResp, id: 5, n: 4}, nil),                                                   // payload missing
		append(frame(header{typ: tExchResp, id: 5, status: stFailed, n: 4}, nil), "data"...),              // payload on a failed answer
		frame(header{typ: tExchResp, id: 5, n: fuzzLimits.maxPayload + 1}, nil),                           // payload over the limit
		append(frame(header{typ: tExchReq, id: 5, n: 4}, req), "data"...),                                 // payload on a request
	}
	return good, bad
}

func TestSeedFramesParse(t *testing.T) {
	seeds := seedFrames()
	for i, b := range seeds[:17] {
		if _, err := parseFrame(b, fuzzLimits); err != nil {
			t.Errorf("seed %d: %v", i, err)
		}
	}
	for i, b := range seeds[17:] {
		if _, err := parseFrame(b, fuzzLimits); err == nil {
			t.Errorf("near miss %d parsed", i)
		}
	}
	if os.Getenv("TENSORCAST_WRITE_CORPUS") != "" {
		dir := filepath.Join("testdata", "fuzz", "FuzzParseFrame")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, b := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		good, bad := exchangeSeedFrames()
		for i, b := range append(good, bad...) {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("exchange-%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// FuzzParseFrame: any bytes decode to a frame or a typed error, never a
// panic; a header that decodes re-encodes to the same bytes.
func FuzzParseFrame(f *testing.F) {
	for _, b := range seedFrames() {
		f.Add(b)
	}
	good, bad := exchangeSeedFrames()
	for _, b := range append(good, bad...) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseFrame(b, fuzzLimits)
		if err != nil {
			return
		}
		var re [hdrLen]byte
		putHeader(re[:], &h)
		if !bytes.Equal(re[:], b[:hdrLen]) {
			t.Fatalf("header %x re-encodes as %x", b[:hdrLen], re)
		}
		if (h.metaLen > fuzzLimits.maxMeta && h.typ != tExchReq && h.typ != tExchResp) || h.payloadLen() > fuzzLimits.maxPayload {
			t.Fatalf("limits not enforced: %+v", h)
		}
	})
}
