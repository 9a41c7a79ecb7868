package daemon

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// linkRegionOf is what d2's link to d1 learned about the export named name.
func (p *rdmaPair) linkRegionOf(t *testing.T, name string) (*rdmaLink, rdma.RemoteRegion, bool) {
	t.Helper()
	l := (*p.d2.d.rdma.links.Load())["d1"]
	if l == nil {
		t.Fatalf("d2 has no rdma link to d1:\n%s", p.d2.log.String())
	}
	for r, reg := range *l.segs.Load() {
		if r.Name() == name {
			return l, reg, true
		}
	}
	return l, rdma.RemoteRegion{}, false
}

type errCompleter chan error

func (c errCompleter) TaskDone(_ *xfer.Task, _ uint64, err error) { c <- err }

// postRaw posts one request on the link's own transport against reg,
// past every check the requesting daemon makes: only the owner's device
// stands between it and the owner's memory.
func postOnLink(t *testing.T, l *rdmaLink, id xfer.SegmentID, reg rdma.RemoteRegion, req xfer.Request) error {
	t.Helper()
	if err := l.tr.AddRemote(id, reg); err != nil {
		t.Fatal(err)
	}
	defer l.tr.RemoveRemote(id)
	req.Target = id
	done := make(errCompleter, 1)
	task := &xfer.Task{Req: req}
	task.SetCompleter(done)
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := l.tr.Submit([]*xfer.Task{task})
		if n == 1 {
			break
		}
		if !errors.Is(err, rdma.ErrQPDown) && !errors.Is(err, rdma.ErrQueueFull) || time.Now().After(deadline) {
			t.Fatalf("posting %v: %v", req.Op, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%v posted on the link did not end", req.Op)
		return nil
	}
}

func wantRemAccessErr(t *testing.T, err error, what string) {
	t.Helper()
	var ce *rdma.CompletionError
	if !errors.As(err, &ce) || ce.Status != rdma.WCRemAccessErr {
		t.Fatalf("%s: %v, want IBV_WC_REM_ACCESS_ERR", what, err)
	}
}

// TestVerbsExportRightsEnforcedByOwner: with an RDMA device (make test-rdma
// runs it in the Soft-RoCE VM), the exporting daemon's device enforces an
// export's rights and its end. The requesting daemon's own checks are
// bypassed by posting on its link directly: a WRITE into a read-only
// export is refused by the owner and changes nothing, no peer is given
// keys to the whole pool, and after UnexportSegment the peer has dropped
// the export's keys (its requests go to tcp, which refuses them) and the
// old keys no longer work.
func TestVerbsExportRightsEnforcedByOwner(t *testing.T) {
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("no RDMA device: RXE_DEV is unset (make test-rdma runs this in the Soft-RoCE VM)")
	}
	p := startRDMAPair(t, "on")
	rng := rand.New(rand.NewPCG(6, 6))
	fill(rng, p.wMem[p.src:p.src+p.block])
	p.untilNoTCP(t, xfer.Request{Op: xfer.OpWrite, Local: p.pool, LocalOffset: p.src, Target: p.rs.ID, Length: 64 << 10})

	// A read-only export of another block.
	pi, _ := p.exp.Pool()
	offs, err := p.exp.AllocBlocks(nil, 1, p.block)
	if err != nil {
		t.Fatal(err)
	}
	roOff := offs[0]
	fill(rng, p.expMem[roOff:roOff+p.block])
	if _, err := p.exp.ExportSegment("ro", pi.Segment, roOff, p.block, client.RightRead); err != nil {
		t.Fatal(err)
	}
	ro, err := p.wr.OpenRemote("d1/ro", client.RightRead)
	if err != nil {
		t.Fatal(err)
	}
	p.untilNoTCP(t, xfer.Request{Op: xfer.OpRead, Local: p.pool, LocalOffset: p.dst, Target: ro.ID, Length: 64 << 10})
	if !bytes.Equal(p.wMem[p.dst:p.dst+64<<10], p.expMem[roOff:roOff+64<<10]) {
		t.Fatal("READ of the read-only export returned other bytes")
	}
	l, roReg, ok := p.linkRegionOf(t, "ro")
	if !ok {
		t.Fatal("d2's link has no registration of d1/ro after an rdma READ of it")
	}
	if got := l.tr.PeerRegions(); len(got) != 0 {
		t.Fatalf("d1 exposed %d regions in its connection data (its pool?), want none", len(got))
	}
	if roReg.Size != p.block {
		t.Fatalf("d1/ro registered as %d bytes, the export is %d", roReg.Size, p.block)
	}
	before := bytes.Clone(p.expMem[roOff : roOff+p.block])
	w := xfer.Request{Op: xfer.OpWrite, Local: p.pool, LocalOffset: p.src, Length: 4096}
	wantRemAccessErr(t, postOnLink(t, l, 1<<40, roReg, w), "WRITE into a read-only export past the sender's check")
	if !bytes.Equal(p.expMem[roOff:roOff+p.block], before) {
		t.Fatal("a refused WRITE changed the read-only export")
	}
	// Beyond the export: the registration covers its bytes only.
	beyond := roReg
	beyond.Size += 4096
	beyond.RKeys = append([]uint32(nil), roReg.RKeys...)
	r := xfer.Request{Op: xfer.OpRead, Local: p.pool, LocalOffset: p.dst, TargetOffset: p.block, Length: 4096}
	wantRemAccessErr(t, postOnLink(t, l, 1<<40+1, beyond, r), "READ past the end of an export")

	// Unexport revokes.
	_, kvReg, ok := p.linkRegionOf(t, "kv")
	if !ok {
		t.Fatal("d2's link has no registration of d1/kv after an rdma WRITE to it")
	}
	if err := p.exp.UnexportSegment("kv"); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := p.linkRegionOf(t, "kv"); ok {
		t.Fatalf("d2 still holds d1/kv's keys after UnexportSegment returned:\n%s", p.d2.log.String())
	}
	if st, err := p.exp.Stats(); err != nil || !slices.Contains(st.Transports, wire.Counter{Name: "rdma.exports_revoked", Value: 1}) {
		t.Fatalf("d1 stats after one revocation: %v %+v", err, st.Transports)
	}
	if !strings.Contains(p.d1.log.String(), "export's rdma registration revoked") {
		t.Fatalf("d1 did not log the revocation:\n%s", p.d1.log.String())
	}
	wantRemAccessErr(t, postOnLink(t, l, 1<<40+2, kvReg, xfer.Request{Op: xfer.OpRead, Local: p.pool, LocalOffset: p.dst, Length: 4096}),
		"READ with an unexported segment's old keys")
	res := make([]error, 1)
	rd := xfer.Request{Op: xfer.OpRead, Local: p.pool, LocalOffset: p.dst, Target: p.rs.ID, Length: 4096}
	if sum, err := p.wr.Transfer([]xfer.Request{rd}, 10*time.Second, res); err != nil || sum.Completed != 0 || !errors.Is(res[0], client.ErrNotFound) {
		t.Fatalf("READ of the unexported segment through the client: %v, %v, %+v (want NOT_FOUND from its owner)", err, res[0], sum)
	}
	// The link survives the refusals: the read-only export still moves
	// over rdma once its queue pairs are rebuilt.
	p.untilNoTCP(t, xfer.Request{Op: xfer.OpRead, Local: p.pool, LocalOffset: p.dst, Target: ro.ID, Length: 1 << 20})
	if !bytes.Equal(p.wMem[p.dst:p.dst+1<<20], p.expMem[roOff:roOff+1<<20]) {
		t.Fatal("READ of the read-only export after the refusals returned other bytes")
	}
}
