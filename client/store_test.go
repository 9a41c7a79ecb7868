package client

import (
	"errors"
	"testing"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/wire"
)

// TestStorePositional: a store answer with another number of results than
// keys fails the whole call with ErrProtocol and closes the client.
func TestStorePositional(t *testing.T) {
	two := [][]byte{[]byte("a"), []byte("b")}
	ext := []Extent{{Segment: 2, Length: 1}, {Segment: 2, Length: 1}}
	cases := []struct {
		name string
		ans  wire.Response
		call func(c *Client) error
	}{
		{"put one code for two", wire.Response{Body: &wire.StorePutResponse{Codes: []wire.Code{0}}},
			func(c *Client) error { return c.StorePut(two, ext, false, make([]error, 2)) }},
		{"read lengths short", wire.Response{Body: &wire.StoreReadResponse{Codes: []wire.Code{0, 0}, Lengths: []uint64{1}}},
			func(c *Client) error { return c.StoreRead(two, ext, make([]uint64, 2), make([]error, 2)) }},
		{"remove three codes for two", wire.Response{Body: &wire.StoreRemoveResponse{Codes: []wire.Code{0, 0, 0}}},
			func(c *Client) error { return c.StoreRemove(two, make([]error, 2)) }},
		{"pin short", wire.Response{Body: &wire.StorePinResponse{}},
			func(c *Client) error { return c.StorePin(two, 0, make([]error, 2)) }},
		{"unpin short", wire.Response{Body: &wire.StoreUnpinResponse{Codes: []wire.Code{0}}},
			func(c *Client) error { return c.StoreUnpin(two, make([]error, 2)) }},
		{"reserve offsets short", wire.Response{Body: &wire.StoreReserveResponse{Codes: []wire.Code{0, 0}, Offsets: []uint64{0}}},
			func(c *Client) error {
				return c.StoreReserve(two, []uint64{1, 1}, make([]uint64, 2), make([]error, 2))
			}},
		{"commit long", wire.Response{Body: &wire.StoreCommitResponse{Codes: []wire.Code{0, 0, 0}}},
			func(c *Client) error { return c.StoreCommit(two, true, make([]error, 2)) }},
		{"list longer than asked", wire.Response{Body: &wire.StoreListResponse{Keys: []wire.StoreKeyInfo{{Key: []byte("a")}, {Key: []byte("b")}}}},
			func(c *Client) error { _, _, err := c.StoreList(nil, nil, 1); return err }},
		{"stat with another body", wire.Response{Body: &wire.StoreListResponse{}},
			func(c *Client) error { _, err := c.StoreStat([]byte("a")); return err }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := fakeDaemon(t, func(*wire.Request) wire.Response { return tc.ans })
			c, err := Dial(sock, Options{NoPool: true})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := tc.call(c); !errors.Is(err, ErrProtocol) {
				t.Fatalf("got %v, want ErrProtocol", err)
			}
			if err := c.Ping(nil); !errors.Is(err, ErrClosed) {
				t.Fatalf("client still used after a protocol violation: %v", err)
			}
		})
	}
}

// TestResultsCheck: a store op's completion is a whole answer only when
// every record was written, with a code that is one, as many OK as the
// completion says, and locations inside the pool.
func TestResultsCheck(t *testing.T) {
	pool := make([]byte, 1<<20)
	c := &Client{poolMem: pool}
	mem := make([]byte, 4*queue.StoreResultSize)
	r := &Results{c: c, mem: mem, n: 3, op: queue.OpStoreGet}
	write := func(codes ...uint8) {
		for i := range mem {
			mem[i] = 0
		}
		mem[3*queue.StoreResultSize] = queue.StoreUnwritten // past n: not looked at
		for i, k := range codes {
			queue.PutStoreResult(mem[i*queue.StoreResultSize:], k, 4096, uint64(i)*8192)
		}
	}
	ok := func(n uint64) Completion { return Completion{UserData: 1, N: n} }

	write(0, 2, 0)
	if err := r.Check(ok(2)); err != nil {
		t.Fatalf("whole answer: %v", err)
	}
	if r.Err(1) != ErrNotFound || r.Err(0) != nil {
		t.Fatalf("per-key errors %v %v", r.Err(0), r.Err(1))
	}
	if off, l := r.Location(2); off != 16384 || l != 4096 || len(r.Value(2)) != 4096 || r.Value(1) != nil {
		t.Fatalf("location %d %d", off, l)
	}
	for _, tc := range []struct {
		name  string
		codes []uint8
		cq    Completion
	}{
		{"a record never written", []uint8{0, 0, queue.StoreUnwritten}, ok(2)},
		{"a code that is none", []uint8{0, 0, 11}, ok(2)},
		{"fewer OK than the completion", []uint8{0, 2, 2}, ok(2)},
		{"more OK than the completion", []uint8{0, 0, 0}, ok(2)},
	} {
		write(tc.codes...)
		if err := r.Check(tc.cq); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want ErrProtocol", tc.name, err)
		}
	}
	write(0, 0, 0)
	mem[2] = 1 // a reserved byte
	if err := r.Check(ok(3)); !errors.Is(err, ErrProtocol) {
		t.Errorf("a reserved byte set: %v", err)
	}
	write(0, 0, 0)
	queue.PutStoreResult(mem[queue.StoreResultSize:], 0, 8192, 1<<20-4096)
	if err := r.Check(ok(3)); !errors.Is(err, ErrProtocol) {
		t.Errorf("a location past the pool: %v", err)
	}
	// A call refused as a whole answers its code's sentinel; an UNPIN
	// refused all or nothing has its records too.
	if err := r.Check(Completion{Code: tcproto.CodeINVALID_ARGUMENT}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("refused call: %v", err)
	}
	r.op = queue.OpStoreUnpin
	write(6, 6, 6)
	if err := r.Check(Completion{Code: tcproto.CodeFAILED_PRECONDITION}); !errors.Is(err, ErrFailedPrecondition) {
		t.Errorf("unpin refused: %v", err)
	}
	write(6, 6, queue.StoreUnwritten)
	if err := r.Check(Completion{Code: tcproto.CodeFAILED_PRECONDITION}); !errors.Is(err, ErrProtocol) {
		t.Errorf("unpin refused with a record missing: %v", err)
	}
}

// FuzzResultsCheck: whatever bytes a daemon leaves in the results region
// and whatever completion it posts, Check answers without panicking, and a
// nil answer means every record is one the protocol allows with the
// completion's count of OK keys.
func FuzzResultsCheck(f *testing.F) {
	good := make([]byte, 4*queue.StoreResultSize)
	for i := 0; i < 4; i++ {
		queue.PutStoreResult(good[i*queue.StoreResultSize:], uint8(i%2)*2, 4096, uint64(i)*8192)
	}
	f.Add(good, uint64(2), uint32(0), uint8(queue.OpStoreGet))
	f.Add(good[:16], uint64(1), uint32(6), uint8(queue.OpStoreUnpin))
	f.Add(make([]byte, 64), uint64(9), uint32(0), uint8(queue.OpStoreExists))
	f.Fuzz(func(t *testing.T, mem []byte, n uint64, code uint32, op uint8) {
		k := len(mem) / queue.StoreResultSize
		if k == 0 {
			return
		}
		r := &Results{c: &Client{poolMem: make([]byte, 1<<20)}, mem: mem[:k*queue.StoreResultSize], n: k, op: op}
		err := r.Check(Completion{N: n, Code: wire.Code(code)})
		if err != nil {
			return
		}
		ok := uint64(0)
		for i := 0; i < k; i++ {
			c, _, _, zero := queue.StoreResult(r.mem[i*queue.StoreResultSize:])
			if !zero || c > uint8(tcproto.CodeINTERNAL) {
				t.Fatalf("record %d accepted: code %d", i, c)
			}
			if c == 0 {
				ok++
			}
		}
		if ok != n || code != 0 {
			t.Fatalf("accepted %d OK records for a completion of %d (code %d)", ok, n, code)
		}
	})
}
