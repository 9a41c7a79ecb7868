//go:build linux && cgo

package rdma

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// The access a region is registered with is enforced by the device of the
// side that owns it, whatever the peer posts: a READ of a region without
// remote read, a WRITE of one without remote write, or any use of a
// deregistered region's rkeys ends with IBV_WC_REM_ACCESS_ERR and leaves the
// memory as it was.
func TestVerbsRegisterAccess(t *testing.T) {
	const size = 64 << 10
	d := openDevice(t, Config{QPs: 1})
	la := mmapBuf(t, size)
	local, err := d.RegisterAccess(la, AccessLocal)
	if err != nil {
		t.Fatalf("RegisterAccess local: %v", err)
	}
	t.Cleanup(func() { _ = d.Deregister(local) })
	if local.Access() != AccessLocal {
		t.Fatalf("Access() = %v, want AccessLocal", local.Access())
	}
	if _, err := d.RegisterAccess(la, Access(1<<5)); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("RegisterAccess with an unknown flag: %v, want ErrInvalid", err)
	}
	mem := map[uint64][]byte{}
	regs := map[uint64]*Region{}
	for name, acc := range map[uint64]Access{1: AccessRemoteRead, 2: AccessRemote, 3: AccessLocal, 4: AccessRemoteWrite, 5: AccessRemote} {
		mem[name] = mmapBuf(t, size)
		for i := range mem[name] {
			mem[name][i] = byte(name)
		}
		r, err := d.RegisterAccess(mem[name], acc)
		if err != nil {
			t.Fatalf("RegisterAccess %v: %v", acc, err)
		}
		regs[name] = r
	}
	a, err := d.NewTransport()
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.NewTransport()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.Close()
		_ = b.Close()
		for name, r := range regs {
			if r != nil {
				if err := d.Deregister(r); err != nil {
					t.Errorf("Deregister %d: %v", name, err)
				}
			}
		}
	})
	for name, r := range regs {
		b.Expose(name, r)
	}
	segs := xfertest.Segments{}
	segs.Set(t, segLocal, xfer.SlotRDMA, LocalKeys(local, nil, nil))
	if err := a.Connect(Loopback{b}); err != nil {
		t.Fatalf("Connect: %v", err)
	}
	for _, rr := range a.PeerRegions() {
		k, err := RemoteKeys(rr, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		segs.Set(t, xfer.SegmentID(100+rr.Name), xfer.SlotRDMA, k)
	}
	// do runs one request, resubmitting while the queue pair is being
	// rebuilt after the previous refusal.
	do := func(op xfer.Op, name uint64) error {
		t.Helper()
		r := newRecorder()
		tasks := segs.Tasks(r, xfer.Request{Op: op, Local: segLocal, Target: xfer.SegmentID(100 + name), Length: 4096})
		var last error
		testutil.Eventually(t, 20*time.Second, func() bool {
			n, err := a.Submit(tasks)
			if n != 1 && !errors.Is(err, ErrQPDown) && !errors.Is(err, ErrQueueFull) {
				t.Fatalf("Submit %v to region %d: %v", op, name, err)
			}
			last = err
			return n == 1
		}, "Submit %v to region %d taken (refused with %v)", op, name, testutil.Lazy(func() error { return last }))
		r.Wait(t, 1)
		r.Check(t, tasks)
		return r.Err(tasks[0])
	}
	refused := func(err error, what string) {
		t.Helper()
		var ce *CompletionError
		if !errors.As(err, &ce) || ce.Status != WCRemAccessErr {
			t.Errorf("%s: %v, want IBV_WC_REM_ACCESS_ERR", what, err)
		}
	}
	for i := range la {
		la[i] = 0xee
	}
	if err := do(xfer.OpRead, 1); err != nil || la[0] != 1 {
		t.Fatalf("READ of a read-only region: %v (first byte %#x)", err, la[0])
	}
	for i := range la {
		la[i] = 0xee
	}
	refused(do(xfer.OpWrite, 1), "WRITE of a read-only region")
	refused(do(xfer.OpRead, 3), "READ of a region registered for local use")
	refused(do(xfer.OpWrite, 3), "WRITE of a region registered for local use")
	refused(do(xfer.OpRead, 4), "READ of a write-only region")
	if err := do(xfer.OpWrite, 4); err != nil {
		t.Errorf("WRITE of a write-only region: %v", err)
	}
	if err := do(xfer.OpWrite, 2); err != nil {
		t.Errorf("WRITE of a read-write region: %v", err)
	}
	for name, want := range map[uint64]byte{1: 1, 3: 3, 2: 0xee, 4: 0xee} {
		if got := mem[name][:4096]; !bytes.Equal(got, bytes.Repeat([]byte{want}, 4096)) {
			t.Errorf("region %d: first byte %#x after the refusals, want %#x", name, got[0], want)
		}
	}
	// Deregistering revokes: the peer's keys of region 5 stop working.
	if err := do(xfer.OpRead, 5); err != nil {
		t.Fatalf("READ before deregistering: %v", err)
	}
	if err := d.Deregister(regs[5]); err != nil {
		t.Fatal(err)
	}
	regs[5] = nil
	refused(do(xfer.OpRead, 5), "READ of a deregistered region")
	if err := do(xfer.OpRead, 2); err != nil {
		t.Errorf("READ of a region still registered, after the refusals: %v", err)
	}
}
