package control

import (
	"fmt"
	"strings"
	"testing"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/wire"
)

// TestDirectoryResponseFitsFrame: a directory larger than a frame is
// answered with the members that fit, the total beside them, and the
// encoded answer within the frame limit; lease and age unknowns are
// marked as such.
func TestDirectoryResponseFitsFrame(t *testing.T) {
	st := directory.Status{Backend: "etcd", State: directory.StateUp, Self: "d0", Epoch: 9,
		Endpoints: []string{"http://127.0.0.1:2379"}, Budget: 2 * time.Second, LeaseTTL: 10 * time.Second,
		Cache: directory.CacheStats{Lookups: 10, Hits: 9, Age: directory.Never, Rev: -1}}
	for i := range 20000 {
		st.Members = append(st.Members, directory.MemberStatus{ID: fmt.Sprintf("%s-%05d", strings.Repeat("m", 50), i),
			Epoch: uint64(i + 1), Addr: "10.0.0.1:7400", Caps: []string{"tcp", "notify", "rdma"}, Age: time.Duration(i) * time.Millisecond,
			LeaseLeft: time.Duration(i%2*2-1) * time.Second})
	}
	const maxFrame = 256 << 10
	r := directoryResponse(st, maxFrame)
	frame := wire.EncodeResponse(flatbuffers.NewBuilder(0), &wire.Response{Body: &r})
	if len(frame)-wire.FrameHeader > maxFrame {
		t.Fatalf("answer of %d bytes, frame limit %d", len(frame)-wire.FrameHeader, maxFrame)
	}
	if r.MembersTotal != 20000 || len(r.Members) == 0 || len(r.Members) >= 20000 {
		t.Fatalf("%d of %d members listed", len(r.Members), r.MembersTotal)
	}
	// The cut leaves most of the frame used, not a token handful.
	if len(frame) < maxFrame/2 {
		t.Fatalf("answer of %d bytes holds only %d members", len(frame), len(r.Members))
	}
	m0, m1 := r.Members[0], r.Members[1]
	if m0.LeaseKnown || !m1.LeaseKnown || m1.LeaseLeftMS != 1000 || m1.AgeMS != 1 || len(m1.Caps) != 3 {
		t.Fatalf("members %+v %+v", m0, m1)
	}
	if r.Cache.Synced || r.Cache.AgeMS != wire.AgeNever || r.Cache.Revision != 0 || r.BudgetMS != 2000 || r.LeaseTTLMS != 10000 {
		t.Fatalf("cache %+v, budget %d, ttl %d", r.Cache, r.BudgetMS, r.LeaseTTLMS)
	}
	var back wire.Response
	if err := wire.DecodeResponse(frame[wire.FrameHeader:], wire.DecodeLimits{}, &back); err != nil {
		t.Fatalf("the cut answer does not decode: %v", err)
	}
}
