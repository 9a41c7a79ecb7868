package store

import (
	"errors"
	"fmt"
	"testing"
)

// TestKeyLimitEveryCall: every batch call of exactly MaxKeysPerCall keys
// runs; one key more refuses the call as a whole (ErrBadCall, every code
// INVALID_ARGUMENT) and changes nothing: no key stored, pinned, reserved
// or removed, the LRU order as it was.
func TestKeyLimitEveryCall(t *testing.T) {
	const limit = 4
	e := newEnv(t, 16<<20, withL2(32<<20), withCfg(func(c *Config) { c.MaxKeysPerCall = limit }))
	ss := e.s.NewSession()
	defer ss.Close()
	stored := keysN("s", limit)
	mustCodes(t, "put", e.put(ss, stored, valuesFor(stored, 100), false), OK)
	if err := e.s.Flush(flushWait); err != nil { // no writeback changes L2 under a snapshot
		t.Fatal(err)
	}
	fresh := keysN("f", limit)
	// each runs a call over keys with codes (len(keys) of them) and
	// returns its error.
	each := []struct {
		name string
		call func(keys [][]byte, codes []Code) error
	}{
		{"Exists", func(k [][]byte, c []Code) error { return e.s.Exists(k, c) }},
		{"Get", func(k [][]byte, c []Code) error {
			_, err := ss.Get(k, make([]Location, len(k)), c, nil, nil, 0)
			return err
		}},
		{"Unpin", func(k [][]byte, c []Code) error { return ss.Unpin(k, c) }},
		{"Pin", func(k [][]byte, c []Code) error { return ss.Pin(k, 0, c) }},
		{"Unpin again", func(k [][]byte, c []Code) error { return ss.Unpin(k, c) }},
		{"Read", func(k [][]byte, c []Code) error {
			d := make([][]byte, len(k))
			for i := range d {
				d[i] = make([]byte, 4096)
			}
			_, err := e.s.Read(k, d, make([]uint64, len(k)), c, nil, nil, 0)
			return err
		}},
		{"LookupPrefix", func(k [][]byte, c []Code) error {
			n, err := ss.LookupPrefix(k, true)
			if err == nil && n != len(k) {
				return fmt.Errorf("prefix of %d, want %d", n, len(k))
			}
			if err == nil {
				return ss.Unpin(k, c)
			}
			fill(c, InvalidArgument) // a call refused whole has no codes to set
			return err
		}},
		{"Put", func(k [][]byte, c []Code) error {
			_, err := ss.Put(k, valuesFor(k, 100), true, c, nil, nil, 0)
			return err
		}},
		{"Remove", func(k [][]byte, c []Code) error {
			_, err := e.s.Remove(k, c, nil, nil, 0)
			return err
		}},
		{"Reserve", func(k [][]byte, c []Code) error {
			sizes := make([]uint64, len(k))
			for i := range sizes {
				sizes[i] = 100
			}
			return ss.Reserve(k, sizes, make([]Location, len(k)), c, nil)
		}},
		{"Abort", func(k [][]byte, c []Code) error { return ss.Abort(k, c, nil) }},
		{"Reserve again", func(k [][]byte, c []Code) error {
			sizes := make([]uint64, len(k))
			for i := range sizes {
				sizes[i] = 100
			}
			return ss.Reserve(k, sizes, make([]Location, len(k)), c, nil)
		}},
		{"Commit", func(k [][]byte, c []Code) error {
			_, err := ss.Commit(k, true, c, nil, nil, 0)
			return err
		}},
	}
	for _, c := range each {
		keys := stored
		switch c.name {
		case "Put", "Remove", "Reserve", "Abort", "Reserve again", "Commit":
			keys = fresh
		}
		over := append(keys[:limit:limit], []byte("one more"))
		codes := make([]Code, limit+1)
		before := e.snap()
		pinned, reserved := ss.PinnedBytes(), e.s.Stats().Reserved
		if err := c.call(over, codes); !errors.Is(err, ErrBadCall) {
			t.Fatalf("%s of %d keys: %v, want ErrBadCall", c.name, limit+1, err)
		}
		mustCodes(t, c.name+" one past the limit", codes, InvalidArgument)
		e.mustSame(c.name+" one past the limit", before)
		if ss.PinnedBytes() != pinned || e.s.Stats().Reserved != reserved {
			t.Fatalf("%s one past the limit changed the pins or reservations", c.name)
		}
		if err := c.call(keys, codes[:limit]); err != nil {
			t.Fatalf("%s of exactly %d keys: %v", c.name, limit, err)
		}
		mustCodes(t, c.name+" at the limit", codes[:limit], OK)
	}
	mustCodes(t, "committed", e.exists(fresh), OK)
}
