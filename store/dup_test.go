package store

import (
	"errors"
	"testing"
)

// TestRemoveDuplicateKeys: a key named twice in one Remove is removed
// once and both its positions answer what that removal came to: OK when
// it went (its block on L2 zeroed, the store's own writeback joined, a
// wait for a free L2 task), its error when it failed. The second position
// is no other caller's removal in flight, so it is never BUSY.
func TestRemoveDuplicateKeys(t *testing.T) {
	dup := func(k string) [][]byte { return [][]byte{[]byte(k), []byte("other"), []byte(k)} }
	remove := func(t *testing.T, e *testEnv, keys [][]byte, async bool) ([]Code, []error) {
		t.Helper()
		codes := make([]Code, len(keys))
		errs := make([]error, len(keys))
		var done Completion
		rec := newRecorder()
		if async {
			done = rec
		}
		pending, err := e.s.Remove(keys, codes, errs, done, 3)
		if err != nil {
			t.Fatal(err)
		}
		if pending {
			<-rec.done
		}
		return codes, errs
	}
	for _, async := range []bool{false, true} {
		name := map[bool]string{false: "blocking", true: "async"}[async]
		t.Run(name+"/on L2", func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20))
			ss := e.s.NewSession()
			keys := dup("k")
			mustCodes(t, "put", e.put(ss, keys[:2], valuesFor(keys[:2], 100), true), OK)
			ss.Close()
			codes, errs := remove(t, e, keys, async)
			mustCodes(t, "remove", codes, OK, OK, OK)
			for i, err := range errs {
				if err != nil {
					t.Fatalf("key %d: %v", i, err)
				}
			}
			e.reopen()
			mustCodes(t, "after restart", e.exists(keys), NotFound, NotFound, NotFound)
		})
		t.Run(name+"/fails", func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20))
			ss := e.s.NewSession()
			keys := dup("k")
			mustCodes(t, "put", e.put(ss, keys[:2], valuesFor(keys[:2], 100), true), OK)
			ss.Close()
			e.failZeroWrites()
			codes, errs := remove(t, e, keys, async)
			mustCodes(t, "remove", codes, Internal, Internal, Internal)
			if !errors.Is(errs[0], errInjected) || !errors.Is(errs[2], errInjected) {
				t.Fatalf("errs %v, want the failed removal's error at both positions", errs)
			}
			mustCodes(t, "still there", e.exists(keys), OK, OK, OK)
		})
	}
	t.Run("under writeback", func(t *testing.T) {
		e, ss := holdingWritebacks(t)
		keys := dup("wb")
		mustCodes(t, "put", e.put(ss, keys[:2], valuesFor(keys[:2], 3000), false), OK)
		e.waitHeld("the writebacks in flight", 2)
		codes := make([]Code, 3)
		errs := make([]error, 3)
		rec := newRecorder()
		pending, err := e.s.Remove(keys, codes, errs, rec, 1)
		if err != nil || !pending {
			t.Fatalf("remove under writeback: pending %v, %v, codes %v", pending, err, codes)
		}
		e.endWritebacks(false)
		<-rec.done
		mustCodes(t, "remove", codes, OK, OK, OK)
		mustCodes(t, "gone", e.exists(keys), NotFound, NotFound, NotFound)
	})
	t.Run("in L1 only", func(t *testing.T) {
		e := newEnv(t, 16<<20)
		ss := e.s.NewSession()
		defer ss.Close()
		keys := dup("l1")
		mustCodes(t, "put", e.put(ss, keys[:2], valuesFor(keys[:2], 100), false), OK)
		codes, _ := remove(t, e, keys, false)
		mustCodes(t, "remove", codes, OK, OK, OK)
	})
}
