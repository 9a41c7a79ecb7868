package wire

import (
	"strings"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"
)

// TestRDMAFit: an answer Fit cut to a budget encodes within it and still
// decodes; one that fits is left whole; a long reason is cut to
// MaxRDMAReason.
func TestRDMAFit(t *testing.T) {
	whole := RDMAResponse{State: RDMAEnabled, Device: "rxe0", GID: "::ffff:10.0.2.15",
		Peers: []RDMAPeer{{ID: "d1", Transport: "rdma", Link: "up"}, {ID: "d2", Transport: "tcp", Link: "none"}}}
	if n := whole.Fit(1 << 20); n != 0 || len(whole.Peers) != 2 {
		t.Fatalf("an answer that fits lost %d peers (%d left)", n, len(whole.Peers))
	}
	long := RDMAResponse{State: RDMAUnavailable, Reason: strings.Repeat("x", MaxRDMAReason+100)}
	if long.Fit(1 << 20); len(long.Reason) != MaxRDMAReason {
		t.Fatalf("reason of %d bytes after Fit", len(long.Reason))
	}
	const budget = 64 << 10
	many := RDMAResponse{State: RDMAEnabled, Device: "rxe0", GID: "::ffff:10.0.2.15"}
	for range 20000 {
		many.Peers = append(many.Peers, RDMAPeer{ID: strings.Repeat("p", 60), Transport: "tcp", Link: "none"})
	}
	dropped := many.Fit(budget)
	if dropped == 0 || len(many.Peers) == 0 || dropped+len(many.Peers) != 20000 {
		t.Fatalf("Fit kept %d and dropped %d of 20000 peers", len(many.Peers), dropped)
	}
	resp := Response{}
	*SetResponse[RDMAResponse](&resp) = many
	b := EncodeResponse(flatbuffers.NewBuilder(1024), &resp)
	if len(b) > budget {
		t.Fatalf("the fitted answer encodes in %d bytes, budget %d", len(b), budget)
	}
	var got Response
	if err := DecodeResponse(b[FrameHeader:], DecodeLimits{}, &got); err != nil {
		t.Fatal(err)
	}
	if r, ok := got.Body.(*RDMAResponse); !ok || len(r.Peers) != len(many.Peers) || r.Device != "rxe0" {
		t.Fatalf("decoded %T %+v", got.Body, got.Body)
	}
}
