package directory

import (
	"errors"
	"strings"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	m := Member{ID: "d1", Epoch: 0xabc, Addr: "10.0.0.1:7000", Caps: []string{"tcp", "rdma", "notify"},
		RDMA: &RDMAAddr{Device: "rxe0", Port: 1, GID: "::ffff:10.0.0.1", MTU: 4096}, Started: 1700000000000}
	b, err := EncodeMember(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeMember(b)
	if err != nil || got.ID != m.ID || got.Epoch != m.Epoch || got.RDMA == nil || got.RDMA.GID != m.RDMA.GID || !got.Has("rdma") {
		t.Fatalf("member round trip: %+v %v", got, err)
	}
	e := Export{Owner: "d1", Name: "kv-0", Size: 1 << 20, Rights: RightRead | RightWrite, Epoch: 0xabc, Generation: 3}
	b, err = EncodeExport(e)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeExport(b); err != nil || got != e {
		t.Fatalf("export round trip: %+v %v", got, err)
	}
}

func TestRecordRefused(t *testing.T) {
	members := []string{
		``, `{}`, `[]`, `null`,
		`{"id":"a","epoch":0,"addr":"x:1"}`,
		`{"id":"","epoch":1,"addr":"x:1"}`,
		`{"id":"a/b","epoch":1,"addr":"x:1"}`,
		`{"id":"a","epoch":1,"addr":""}`,
		`{"id":"a","epoch":1,"addr":"x:1","extra":1}`,
		`{"id":"a","epoch":1,"addr":"x:1"} {}`,
		// Closing brackets after the record are no JSON either.
		`{"id":"a","epoch":1,"addr":"x:1"}}`,
		`{"id":"a","epoch":1,"addr":"x:1"} ]`,
		`{"id":"a","epoch":1,"addr":"x:1"}]]}`,
		`{"id":"a","epoch":-1,"addr":"x:1"}`,
		`{"id":"a","epoch":1,"addr":"x:1","caps":["has space"]}`,
		`{"id":"` + strings.Repeat("a", MaxIDLen+1) + `","epoch":1,"addr":"x:1"}`,
		`{"id":"a","epoch":1,"addr":"x:1","caps":["` + strings.Repeat("c\",\"", MaxCaps) + `c"]}`,
		`{"id":"a","epoch":1,"addr":"` + strings.Repeat("x", MaxRecord) + `"}`,
	}
	for _, s := range members {
		if _, err := DecodeMember([]byte(s)); !errors.Is(err, ErrInvalid) {
			t.Errorf("DecodeMember(%.60q) = %v, want ErrInvalid", s, err)
		}
	}
	exports := []string{
		`{"owner":"a","name":"n","size":1,"rights":0,"epoch":1,"gen":1}`,
		`{"owner":"a","name":"n","size":1,"rights":4,"epoch":1,"gen":1}`,
		`{"owner":"a","name":"n","size":0,"rights":1,"epoch":1,"gen":1}`,
		`{"owner":"a","name":"n/x","size":1,"rights":1,"epoch":1,"gen":1}`,
		`{"owner":"a","name":"n","size":1,"rights":1,"epoch":1,"gen":0}`,
		`{"owner":"a","name":"n","size":1,"rights":1,"epoch":0,"gen":1}`,
		`{"owner":"a","name":"n","size":1,"rights":256,"epoch":1,"gen":1}`,
		`{"owner":"a","name":"n","size":1,"rights":1,"epoch":1,"gen":1}}`,
	}
	for _, s := range exports {
		if _, err := DecodeExport([]byte(s)); !errors.Is(err, ErrInvalid) {
			t.Errorf("DecodeExport(%q) = %v, want ErrInvalid", s, err)
		}
	}
}

// FuzzDecodeMember: records come from a store other daemons write;
// whatever they hold, decoding returns a checked member or ErrInvalid,
// and a member it accepts encodes and decodes to itself.
func FuzzDecodeMember(f *testing.F) {
	f.Add([]byte(`{"id":"d1","epoch":1,"addr":"127.0.0.1:7000","caps":["tcp"],"started":1}`))
	f.Add([]byte(`{"id":"d1","epoch":1,"addr":"x:1","rdma":{"device":"rxe0","port":1,"gid":"::1","mtu":4096}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMember(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		out, err := EncodeMember(m)
		if err != nil {
			t.Fatalf("accepted member does not encode: %v", err)
		}
		if m2, err := DecodeMember(out); err != nil || m2.ID != m.ID || m2.Epoch != m.Epoch || m2.Addr != m.Addr {
			t.Fatalf("re-decode: %+v %v", m2, err)
		}
	})
}

// FuzzDecodeExport is FuzzDecodeMember for catalog entries.
func FuzzDecodeExport(f *testing.F) {
	f.Add([]byte(`{"owner":"d1","name":"kv","size":4096,"rights":3,"epoch":7,"gen":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeExport(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		out, err := EncodeExport(e)
		if err != nil {
			t.Fatalf("accepted export does not encode: %v", err)
		}
		if e2, err := DecodeExport(out); err != nil || e2 != e {
			t.Fatalf("re-decode: %+v %v", e2, err)
		}
	})
}
