package control

import (
	"errors"
	"runtime"
	"testing"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/store"
)

// TestStoreKeyLimitOnTheSocket: a store call on the socket of exactly the
// store's MaxKeysPerCall keys runs, one of a key more is refused as a
// whole (INVALID_ARGUMENT, nothing done), whatever the call: a put or a
// read large enough to be copied in parts on several goroutines, each part
// a store call of fewer keys, is bounded by the call's keys too.
func TestStoreKeyLimitOnTheSocket(t *testing.T) {
	const limit = 8
	const size = 1 << 20 // 9 values of it: a call cut in parts on 2 processors
	defer runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), 2))
	e := newStoreEnv(t, false, store.Config{MaxKeysPerCall: limit, L1Capacity: 16 << 20, MaxSessionPinned: 16 << 20})
	c, err := client.Dial(e.sock, client.Options{Name: "key-limit"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf, err := c.RegisterBuffer((limit + 1) * size)
	if err != nil {
		t.Fatal(err)
	}
	exts := func(n int) []client.Extent {
		x := make([]client.Extent, n)
		for i := range x {
			x[i] = client.Extent{Segment: buf.ID, Offset: uint64(i * size), Length: size}
		}
		return x
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, client.ErrInvalidArgument) {
			t.Fatalf("%s of %d keys: %v, want the call refused INVALID_ARGUMENT", what, limit+1, err)
		}
	}
	ran := func(what string, err error, res []error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s of %d keys: %v", what, limit, err)
		}
		for i, r := range res {
			var se *client.StatusError
			if r != nil && (!errors.As(r, &se) || se.Code == tcproto.CodeINVALID_ARGUMENT) {
				t.Fatalf("%s of %d keys: key %d: %v", what, limit, i, r)
			}
		}
	}
	over, at := keysOf("over", limit+1), keysOf("at", limit)
	res := make([]error, limit+1)
	lens := make([]uint64, limit+1)

	refused("put", c.StorePut(over, exts(limit+1), false, res))
	if st := e.s.Stats(); st.Keys != 0 {
		t.Fatalf("a refused put stored %d keys", st.Keys)
	}
	ran("put", c.StorePut(at, exts(limit), false, res[:limit]), res[:limit])
	if st := e.s.Stats(); st.Keys != limit {
		t.Fatalf("%d keys stored, want %d", st.Keys, limit)
	}
	refused("read", c.StoreRead(append(at[:limit:limit], at[0]), exts(limit+1), lens, res))
	ran("read", c.StoreRead(at, exts(limit), lens[:limit], res[:limit]), res[:limit])

	for _, call := range []struct {
		name string
		fn   func(keys [][]byte, res []error) error
	}{
		{"pin", func(k [][]byte, r []error) error { return c.StorePin(k, 0, r) }},
		{"unpin", func(k [][]byte, r []error) error { return c.StoreUnpin(k, r) }},
		{"reserve", func(k [][]byte, r []error) error {
			sizes := make([]uint64, len(k))
			for i := range sizes {
				sizes[i] = 4096
			}
			return c.StoreReserve(k, sizes, make([]uint64, len(k)), r)
		}},
		{"commit", func(k [][]byte, r []error) error { return c.StoreCommit(k, false, r) }},
		{"abort", func(k [][]byte, r []error) error { return c.StoreAbort(k, r) }},
		{"remove", func(k [][]byte, r []error) error { return c.StoreRemove(k, r) }},
	} {
		refused(call.name, call.fn(append(at[:limit:limit], at[0]), res))
		ran(call.name, call.fn(at, res[:limit]), res[:limit])
		if call.name == "pin" && e.s.Stats().Pins != limit {
			t.Fatalf("%s: %d pins, want %d", call.name, e.s.Stats().Pins, limit)
		}
	}
	if st := e.s.Stats(); st.Keys != 0 || st.Pins != 0 || st.Reserved != 0 {
		t.Fatalf("left behind: %d keys, %d pins, %d reserved", st.Keys, st.Pins, st.Reserved)
	}
}
