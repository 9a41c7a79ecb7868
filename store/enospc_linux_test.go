package store

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestENOSPC: an L2 file larger than its file system: the durable put that
// does not fit gets RESOURCE_EXHAUSTED with ENOSPC as its error, nothing of
// it stays, the store keeps serving, and a slot freed by a Remove (already
// allocated on the device) takes the next put.
func TestENOSPC(t *testing.T) {
	requireUring(t)
	mnt := testutil.MountSmallExt4(t)
	u, err := openUring(mnt, Config{}, FileL2{Size: 64 << 20, RegionSize: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := u.close(); err != nil {
			t.Error(err)
		}
	}()
	ss := u.s.NewSession()
	defer ss.Close()
	val := make([]byte, 256<<10)
	codes, errs := make([]Code, 1), make([]error, 1)
	var stored [][]byte
	var full error
	for i := 0; i < 256 && full == nil; i++ {
		key := [][]byte{[]byte(fmt.Sprintf("big-%03d", i))}
		val[0] = byte(i)
		if _, err := ss.Put(key, [][]byte{val}, true, codes, errs, nil, 0); err != nil {
			t.Fatal(err)
		}
		switch codes[0] {
		case OK:
			stored = append(stored, key[0])
		case ResourceExhausted:
			full = errs[0]
			c := make([]Code, 1)
			if err := u.s.Exists(key, c); err != nil || c[0] != NotFound {
				t.Fatalf("the failed key is visible: %v %v", c[0], err)
			}
		default:
			t.Fatalf("put %d: %v %v", i, codes[0], errs[0])
		}
	}
	if !errors.Is(full, syscall.ENOSPC) {
		t.Fatalf("after %d puts: %v, want an error matching ENOSPC", len(stored), full)
	}
	if len(stored) == 0 || len(stored) > 64 {
		t.Fatalf("%d puts of 256 KiB fit a 16 MiB file system", len(stored))
	}
	t.Logf("ENOSPC after %d durable puts: %v", len(stored), full)
	st := u.s.Stats()
	if st.Keys != uint64(len(stored)) || st.DurableFailures == 0 {
		t.Fatalf("stats %+v", st)
	}
	// Still serving: every stored key reads back.
	dst := [][]byte{make([]byte, 256<<10)}
	lens := []uint64{0}
	for i, k := range stored {
		if _, err := u.s.Read([][]byte{k}, dst, lens, codes, errs, nil, 0); err != nil || codes[0] != OK {
			t.Fatalf("read %s: %v %v %v", k, err, codes[0], errs[0])
		}
		if dst[0][0] != byte(i) {
			t.Fatalf("read %s: wrong bytes", k)
		}
	}
	// A removed key's slot is space the device already has.
	if _, err := u.s.Remove(stored[:1], codes, errs, nil, 0); err != nil || codes[0] != OK {
		t.Fatalf("remove: %v %v %v", err, codes[0], errs[0])
	}
	if _, err := ss.Put([][]byte{[]byte("after")}, [][]byte{val}, true, codes, errs, nil, 0); err != nil || codes[0] != OK {
		t.Fatalf("put into a freed slot: %v %v %v", err, codes[0], errs[0])
	}
}
