package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func sampleHeaders() map[string][]byte {
	out := map[string][]byte{}
	enc := func(h *header) []byte {
		b := make([]byte, 4096)
		encodeHeader(b, h)
		return b
	}
	out["block"] = enc(&header{magic: magicBlock, units: 3, seq: 42, nonce: 0x1234567890abcdef, offset: 8192,
		valueLen: 5000, valueCRC: 0xdeadbeef, key: []byte("a key of some length")})
	out["block-maxkey"] = enc(&header{magic: magicBlock, units: 65, seq: 1, nonce: 7, offset: 1 << 40,
		valueLen: 1, valueCRC: 1, key: bytes.Repeat([]byte{0xff}, MaxKeyLen)})
	out["region"] = enc(&header{magic: magicRegion, units: 17, seq: 99, nonce: 5, offset: 4096})
	out["super"] = enc(&header{magic: magicSuper, units: 4096, seq: 3, nonce: 3, offset: 64 << 20})
	out["blank"] = make([]byte, 4096)
	torn := bytes.Clone(out["block"])
	torn[30] ^= 1
	out["torn"] = torn
	out["short"] = out["block"][:40]
	keylen := bytes.Clone(out["block"])
	keylen[10], keylen[11] = 0xff, 0xff
	out["keylen"] = keylen
	return out
}

// TestHeaderRoundTrip: every kind encodes and decodes to itself; a flipped
// byte anywhere in the covered bytes is caught.
func TestHeaderRoundTrip(t *testing.T) {
	for name, b := range sampleHeaders() {
		for _, m := range [][8]byte{magicBlock, magicRegion, magicSuper} {
			h, err := decodeHeader(b, m)
			if err != nil {
				continue
			}
			n := hdrFixed + len(h.key)
			for i := 0; i < n; i++ {
				c := bytes.Clone(b)
				c[i] ^= 0x10
				if _, err := decodeHeader(c, m); err == nil {
					t.Fatalf("%s: a flipped byte %d decoded", name, i)
				}
			}
		}
	}
	cases := map[string]error{"blank": errBlank, "torn": errDamaged, "short": errDamaged, "keylen": errDamaged}
	s := sampleHeaders()
	for name, want := range cases {
		if _, err := decodeHeader(s[name], magicBlock); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	if _, err := decodeHeader(s["region"], magicBlock); !errors.Is(err, errForeign) {
		t.Errorf("a region header read as a block: %v", err)
	}
}

// FuzzDecodeHeader: the decoder of L2 header sectors (bytes from the
// device, which a client's values may have shaped) never panics, and
// whatever it accepts re-encodes to the very same bytes.
func FuzzDecodeHeader(f *testing.F) {
	for _, b := range sampleHeaders() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range [][8]byte{magicBlock, magicRegion, magicSuper} {
			h, err := decodeHeader(b, m)
			if err != nil {
				if !errors.Is(err, errBlank) && !errors.Is(err, errForeign) && !errors.Is(err, errDamaged) {
					t.Fatalf("untyped error %v", err)
				}
				continue
			}
			n := hdrFixed + len(h.key)
			out := make([]byte, max(hdrMax, n))
			if got := encodeHeader(out, &h); got != n {
				t.Fatalf("re-encoded %d bytes, decoded %d", got, n)
			}
			if !bytes.Equal(out[:n], b[:n]) {
				t.Fatalf("re-encoding differs:\n in %x\nout %x", b[:n], out[:n])
			}
			h2, err := decodeHeader(out, m)
			if err != nil || h2.seq != h.seq || h2.offset != h.offset || !bytes.Equal(h2.key, h.key) {
				t.Fatalf("second decode: %v", err)
			}
		}
	})
}

// TestWriteFuzzSeeds rewrites the committed seed corpus (run with
// STORE_WRITE_FUZZ_SEEDS=1 after a format change).
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("STORE_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set STORE_WRITE_FUZZ_SEEDS=1 to rewrite testdata/fuzz/FuzzDecodeHeader")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeHeader")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range sampleHeaders() {
		if i := bytes.LastIndexFunc(b, func(r rune) bool { return r != 0 }); i+1 < len(b) && name != "blank" {
			b = b[:max(i+1, hdrFixed)]
		}
		if name == "blank" {
			b = b[:hdrMax]
		}
		data := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, "seed-"+name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
