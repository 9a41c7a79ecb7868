package rdma

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func sampleConnInfo() ConnInfo {
	g, _ := ParseGID("::ffff:10.0.2.15")
	return ConnInfo{
		QPIndex: 3, QPN: 0x11, PSN: 0xabcdef, MTU: MTU1024, GID: g,
		Regions: []RemoteRegion{
			{Name: 7, Addr: 0x7f0012340000, Size: 3<<30 + 5, ChunkSize: 1 << 30, RKeys: []uint32{1, 2, 3, 4}},
			{Name: 8, Addr: 4096, Size: 4096, ChunkSize: 1 << 12, RKeys: []uint32{0xffffffff}},
		},
	}
}

func TestConnInfoRoundTrip(t *testing.T) {
	for _, c := range []ConnInfo{sampleConnInfo(), {QPN: 1, MTU: MTU4096}} {
		b, err := c.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var d ConnInfo
		if err := d.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c, d) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", d, c)
		}
	}
}

func TestConnInfoRejects(t *testing.T) {
	good, _ := func() ([]byte, error) { c := sampleConnInfo(); return c.MarshalBinary() }()
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":       nil,
		"short":       good[:connHeader-1],
		"magic":       mut(func(b []byte) []byte { b[0] = 'X'; return b }),
		"version":     mut(func(b []byte) []byte { b[4] = 9; return b }),
		"qpn":         mut(func(b []byte) []byte { b[10] = 1; return b }),
		"mtu":         mut(func(b []byte) []byte { b[17] = 6; return b }),
		"regions":     mut(func(b []byte) []byte { b[34] = 200; return b }),
		"truncated":   good[:len(good)-1],
		"trailing":    append(bytes.Clone(good), 0),
		"key count":   mut(func(b []byte) []byte { b[connHeader+25] = 5; return b }),
		"chunk shift": mut(func(b []byte) []byte { b[connHeader+24] = 63; return b }),
	}
	for name, b := range cases {
		d := ConnInfo{QPN: 42}
		if err := d.UnmarshalBinary(b); !errors.Is(err, ErrConnInfo) {
			t.Errorf("%s: err = %v, want ErrConnInfo", name, err)
		}
		if d.QPN != 42 {
			t.Errorf("%s: failed decode changed the value", name)
		}
	}
	bad := sampleConnInfo()
	bad.PSN = 1 << 24
	if _, err := bad.MarshalBinary(); !errors.Is(err, ErrConnInfo) {
		t.Errorf("marshal psn out of range: err = %v", err)
	}
}

func FuzzConnInfo(f *testing.F) {
	c := sampleConnInfo()
	b, _ := c.MarshalBinary()
	f.Add(b)
	f.Add(b[:connHeader])
	f.Add([]byte("TCRQ\x01"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var d ConnInfo
		if err := d.UnmarshalBinary(in); err != nil {
			if !errors.Is(err, ErrConnInfo) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		out, err := d.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded value does not encode: %v", err)
		}
		if !bytes.Equal(in, out) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", in, out)
		}
	})
}

func TestRemoteRegionRoundTrip(t *testing.T) {
	for _, r := range sampleConnInfo().Regions {
		b, err := r.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var d RemoteRegion
		if err := d.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(r, d) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", d, r)
		}
	}
	bad := RemoteRegion{Addr: 4096, Size: 8192, ChunkSize: 4096, RKeys: []uint32{1}}
	if _, err := bad.MarshalBinary(); !errors.Is(err, ErrConnInfo) {
		t.Errorf("marshal of 1 key for 2 chunks: err = %v, want ErrConnInfo", err)
	}
}

func TestRemoteRegionRejects(t *testing.T) {
	good, err := sampleConnInfo().Regions[0].MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":       nil,
		"magic":       mut(func(b []byte) []byte { b[0] = 'X'; return b }),
		"version":     mut(func(b []byte) []byte { b[4] = 2; return b }),
		"short":       good[:5+regionFixed-1],
		"truncated":   good[:len(good)-1],
		"trailing":    append(bytes.Clone(good), 0),
		"key count":   mut(func(b []byte) []byte { b[5+25] = 3; return b }),
		"chunk shift": mut(func(b []byte) []byte { b[5+24] = 63; return b }),
		"size":        mut(func(b []byte) []byte { b[5+23] = 0xff; return b }),
	}
	for name, b := range cases {
		d := RemoteRegion{Name: 42}
		if err := d.UnmarshalBinary(b); !errors.Is(err, ErrConnInfo) {
			t.Errorf("%s: err = %v, want ErrConnInfo", name, err)
		}
		if d.Name != 42 {
			t.Errorf("%s: failed decode changed the value", name)
		}
	}
}

func FuzzRemoteRegion(f *testing.F) {
	for _, r := range sampleConnInfo().Regions {
		b, _ := r.MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte("TCRR\x01"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var d RemoteRegion
		if err := d.UnmarshalBinary(in); err != nil {
			if !errors.Is(err, ErrConnInfo) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		out, err := d.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded value does not encode: %v", err)
		}
		if !bytes.Equal(in, out) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", in, out)
		}
	})
}

// TestRemoteRegionChunkFloor: a peer's region must be in chunks of at
// least minChunkSize, as every daemon registers them: one that claims
// smaller ones (as small as a byte) would split each request into a work
// request per chunk it touches. Its description, its keys and connection
// data carrying it are refused.
func TestRemoteRegionChunkFloor(t *testing.T) {
	for _, shift := range []uint{0, 11, 12} {
		r := RemoteRegion{Name: 1, Addr: 1 << 20, Size: 4 << shift, ChunkSize: 1 << shift, RKeys: []uint32{1, 2, 3, 4}}
		b := r.appendTo([]byte(regionMagic + string(rune(regionVersion))))
		var d RemoteRegion
		err := d.UnmarshalBinary(b)
		_, kerr := RemoteKeys(r, nil, nil)
		var c ConnInfo
		cb := append([]byte(nil), connMagic...)
		cb = append(cb, connVersion, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(MTU4096))
		cb = append(cb, make([]byte, 16)...)
		cb = append(cb, 1, 0)
		cb = r.appendTo(cb)
		cerr := c.UnmarshalBinary(cb)
		if shift >= 12 {
			if err != nil || kerr != nil || cerr != nil {
				t.Errorf("chunks of %d bytes: decode %v, keys %v, connection data %v", 1<<shift, err, kerr, cerr)
			}
			continue
		}
		if !errors.Is(err, ErrConnInfo) || !errors.Is(kerr, ErrNotRegistered) || !errors.Is(cerr, ErrConnInfo) {
			t.Errorf("chunks of %d bytes: decode %v, keys %v, connection data %v; want all refused", 1<<shift, err, kerr, cerr)
		}
	}
}
