package wire

import (
	"bytes"
	"errors"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
)

// TestKeyList packs and splits keys, and refuses lists that end inside a
// key or its length, or carry more keys than allowed.
func TestKeyList(t *testing.T) {
	keys := [][]byte{[]byte("a"), {}, bytes.Repeat([]byte{0xff}, 300), []byte("model/blk/0001")}
	n := KeysLen(keys)
	if n != 4*KeyHeader+1+300+14 {
		t.Fatalf("KeysLen %d", n)
	}
	packed := AppendKeys(nil, keys)
	buf := make([]byte, n)
	if w := PutKeys(buf, keys); w != n || !bytes.Equal(buf, packed) {
		t.Fatalf("PutKeys wrote %d bytes %x, AppendKeys %x", w, buf, packed)
	}
	got, err := SplitKeys(packed, nil, 10)
	if err != nil || len(got) != len(keys) {
		t.Fatalf("split: %d keys, %v", len(got), err)
	}
	for i := range keys {
		if !bytes.Equal(got[i], keys[i]) {
			t.Fatalf("key %d: %q, want %q", i, got[i], keys[i])
		}
	}
	if KeysLen([][]byte{make([]byte, MaxPackedKey+1)}) != -1 {
		t.Fatal("a key longer than the format carries was measured")
	}
	for _, bad := range [][]byte{packed[:1], packed[:4], packed[:n-1]} {
		if _, err := SplitKeys(bad, nil, 10); !errors.Is(err, ErrMalformed) {
			t.Errorf("split %x: %v, want ErrMalformed", bad, err)
		}
	}
	if _, err := SplitKeys(packed, nil, 3); !errors.Is(err, ErrLimit) {
		t.Errorf("4 keys under a limit of 3: %v", err)
	}
	// The keys alias the list; splitting again into the same slice does
	// not allocate.
	dst := make([][]byte, 0, 8)
	if a := testing.AllocsPerRun(100, func() { dst, _ = SplitKeys(packed, dst, 10) }); a != 0 {
		t.Errorf("SplitKeys allocates %v times", a)
	}
}

// TestStoreMessagesMatchSchema reads store messages this codec writes with
// the accessors flatc generated, so a wrong slot cannot hide behind a codec
// that agrees with itself.
func TestStoreMessagesMatchSchema(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	frame := EncodeRequest(b, &Request{Ctx: Context{RequestID: 5}, Body: &StorePutRequest{Keys: sampleKeys, Values: sampleExtents, Durable: true}})
	r := tcproto.GetSizePrefixedRootAsRequest(frame, 0)
	var tab flatbuffers.Table
	if r.BodyType() != tcproto.RequestBodyStorePutRequest || !r.Body(&tab) {
		t.Fatalf("body %s", r.BodyType())
	}
	var put tcproto.StorePutRequest
	put.Init(tab.Bytes, tab.Pos)
	if !bytes.Equal(put.KeysBytes(), AppendKeys(nil, sampleKeys)) || !put.Durable() || put.ValuesLength() != 3 {
		t.Fatalf("put as the schema reads it: keys %x durable %v values %d", put.KeysBytes(), put.Durable(), put.ValuesLength())
	}
	var e tcproto.StoreExtent
	put.Values(&e, 1)
	if e.Segment() != 1 || e.Offset() != 1<<30 || e.Length() != 1<<20 {
		t.Fatalf("extent 1: %d %d %d", e.Segment(), e.Offset(), e.Length())
	}

	frame = EncodeResponse(b, &Response{RequestID: 9, Body: &StoreListResponse{
		Keys: []StoreKeyInfo{{Key: []byte("k1"), Size: 77, InL2: true, Pins: 2, Tombstone: true}}, More: true}})
	resp := tcproto.GetSizePrefixedRootAsResponse(frame, 0)
	if resp.BodyType() != tcproto.ResponseBodyStoreListResponse || !resp.Body(&tab) {
		t.Fatalf("body %s", resp.BodyType())
	}
	var ls tcproto.StoreListResponse
	ls.Init(tab.Bytes, tab.Pos)
	var ki tcproto.StoreKeyInfo
	if !ls.More() || ls.KeysLength() != 1 || !ls.Keys(&ki, 0) {
		t.Fatal("list as the schema reads it")
	}
	if string(ki.KeyBytes()) != "k1" || ki.Size() != 77 || ki.InL1() || !ki.InL2() || ki.Pins() != 2 || ki.Dirty() || !ki.Tombstone() {
		t.Fatalf("key info as the schema reads it: %q %d %v %v %d %v %v", ki.KeyBytes(), ki.Size(), ki.InL1(), ki.InL2(), ki.Pins(), ki.Dirty(), ki.Tombstone())
	}

	frame = EncodeResponse(b, &Response{RequestID: 9, Body: &StoreStatResponse{Info: StoreKeyInfo{Size: 5, InL1: true, Pins: 1, Dirty: true}}})
	resp = tcproto.GetSizePrefixedRootAsResponse(frame, 0)
	resp.Body(&tab)
	var st tcproto.StoreStatResponse
	st.Init(tab.Bytes, tab.Pos)
	if st.Size() != 5 || !st.InL1() || st.InL2() || st.Pins() != 1 || !st.Dirty() || st.Tombstone() {
		t.Fatal("stat as the schema reads it")
	}
}

// TestStoreDecodePositional: an argument vector that is not positional
// with the keys is a malformed request, not a partial call.
func TestStoreDecodePositional(t *testing.T) {
	var m Request
	for _, body := range []RequestBody{
		&StorePutRequest{Keys: sampleKeys, Values: sampleExtents[:2]},
		&StoreReadRequest{Keys: sampleKeys[:1], Dests: sampleExtents},
		&StoreReserveRequest{Keys: sampleKeys, Sizes: []uint64{1}},
	} {
		if err := DecodeRequest(encodeReq(Request{Body: body})[FrameHeader:], DecodeLimits{}, &m); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s with a vector not positional with its keys: %v", body.Kind(), err)
		}
	}
	if err := DecodeRequest(encodeReq(Request{Body: &StoreRemoveRequest{Keys: sampleKeys}})[FrameHeader:], DecodeLimits{MaxOffsets: 2}, &m); !errors.Is(err, ErrLimit) {
		t.Errorf("3 keys under a limit of 2: %v", err)
	}
}

// FuzzSplitKeys: any bytes split into keys that lie inside them and pack
// back to the same bytes, or fail with a typed error.
func FuzzSplitKeys(f *testing.F) {
	f.Add(AppendKeys(nil, sampleKeys))
	f.Add([]byte{5, 0, 'a'})
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, err := SplitKeys(b, nil, 1<<16)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrLimit) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if got := AppendKeys(nil, keys); !bytes.Equal(got, b) {
			t.Fatalf("split and packed %x, got %x", b, got)
		}
	})
}

// TestContextReplicasMatchSchema: a call's replicas travel in the context
// where the schema puts them (slot 6), and an old frame without them reads
// as 0 (the daemon's store_replicas).
func TestContextReplicasMatchSchema(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	frame := EncodeRequest(b, &Request{Ctx: Context{RequestID: 5, Replicas: 2}, Body: &StoreCommitRequest{Keys: sampleKeys, Durable: true}})
	r := tcproto.GetSizePrefixedRootAsRequest(frame, 0)
	var ctx tcproto.Context
	if r.Ctx(&ctx) == nil || ctx.Replicas() != 2 || ctx.RequestId() != 5 {
		t.Fatalf("context as the schema reads it: replicas %d, request %d", ctx.Replicas(), ctx.RequestId())
	}
	b = flatbuffers.NewBuilder(0)
	frame = EncodeRequest(b, &Request{Ctx: Context{RequestID: 6}, Body: &StoreCommitRequest{Keys: sampleKeys}})
	r = tcproto.GetSizePrefixedRootAsRequest(frame, 0)
	if r.Ctx(&ctx) == nil || ctx.Replicas() != 0 {
		t.Fatalf("a context without replicas reads %d", ctx.Replicas())
	}
}
