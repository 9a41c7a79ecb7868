package wire

import (
	"errors"
	"strings"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
)

// TestDirectoryMessageMatchesSchema reads the DirectoryResponse this codec
// writes with the accessors flatc generated from the schema, so a wrong
// slot cannot hide behind a codec that agrees with itself.
func TestDirectoryMessageMatchesSchema(t *testing.T) {
	want := sampleDirectory()
	frame := EncodeResponse(flatbuffers.NewBuilder(0), &Response{RequestID: 9, Body: want})
	resp := tcproto.GetSizePrefixedRootAsResponse(frame, 0)
	var tab flatbuffers.Table
	if resp.BodyType() != tcproto.ResponseBodyDirectoryResponse || !resp.Body(&tab) {
		t.Fatalf("body %s", resp.BodyType())
	}
	var d tcproto.DirectoryResponse
	d.Init(tab.Bytes, tab.Pos)
	if string(d.Backend()) != "etcd" || string(d.State()) != "up" || d.SinceUnixMs() != want.SinceUnixMS || d.Outages() != 2 ||
		d.EndpointsLength() != 2 || string(d.Endpoints(1)) != "http://10.0.0.2:2379" || string(d.Prefix()) != "/tensorcast/" ||
		d.StalenessBudgetMs() != 2000 || d.LeaseTtlMs() != 10000 || string(d.Self()) != "d1" || d.Epoch() != 0xabc ||
		d.MembersTotal() != 3 || d.Published() != 4 || d.Pending() != 1 {
		t.Fatalf("DirectoryResponse read through the schema differs from %+v", want)
	}
	c := d.Cache(nil)
	if c == nil || c.Lookups() != 100 || c.Hits() != 96 || c.NotFound() != 1 || c.FallbackStore() != 3 || c.FallbackPeer() != 1 ||
		c.Unavailable() != 1 || c.Corrections() != 1 || c.StoreReads() != 3 || c.Dropped() != 4 || c.AgeMs() != 120 ||
		!c.Synced() || c.Revision() != 77 || c.Members() != 2 || c.Exports() != 5 || c.StoreRequests() != 900 {
		t.Fatalf("DirectoryCache read through the schema differs from %+v", want.Cache)
	}
	var m tcproto.DirectoryMember
	if d.MembersLength() != 2 || !d.Members(&m, 0) {
		t.Fatalf("%d members", d.MembersLength())
	}
	if string(m.Id()) != "d1" || m.Epoch() != 0xabc || string(m.Addr()) != "10.0.0.1:7400" || m.CapsLength() != 3 ||
		string(m.Caps(2)) != "rdma" || !m.Self() || m.AgeMs() != 120 || m.LeaseLeftMs() != 9000 || !m.LeaseKnown() {
		t.Fatalf("DirectoryMember read through the schema differs from %+v", want.Members[0])
	}
}

// TestDirectoryDecodeLimits: the client's decoder holds a member's
// capabilities, the endpoints, their strings and the member count to
// their limits, and refuses a string that points out of the frame.
func TestDirectoryDecodeLimits(t *testing.T) {
	decode := func(d *DirectoryResponse, lim DecodeLimits) error {
		var m Response
		return DecodeResponse(encodeResp(Response{Body: d})[FrameHeader:], lim, &m)
	}
	d := sampleDirectory()
	if err := decode(d, DecodeLimits{MaxItems: 1}); !errors.Is(err, ErrLimit) {
		t.Fatalf("two members under a limit of one: %v", err)
	}
	d.Members[1].Caps = make([]string, MaxDirectoryCaps+1)
	for i := range d.Members[1].Caps {
		d.Members[1].Caps[i] = "c"
	}
	if err := decode(d, DecodeLimits{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("%d capabilities: %v", MaxDirectoryCaps+1, err)
	}
	d = sampleDirectory()
	d.Members[0].Caps[1] = strings.Repeat("c", 300)
	if err := decode(d, DecodeLimits{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("a 300-byte capability under the 256-byte string limit: %v", err)
	}
	d = sampleDirectory()
	d.Endpoints = make([]string, MaxDirectoryEndpoints+1)
	if err := decode(d, DecodeLimits{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("%d endpoints: %v", MaxDirectoryEndpoints+1, err)
	}

	// An endpoint whose offset points past the frame.
	d = &DirectoryResponse{Backend: "etcd", State: "up", Self: "d1", Endpoints: []string{"http://x"}}
	frame := encodeResp(Response{Body: d})[FrameHeader:]
	resp := tcproto.GetRootAsResponse(frame, 0)
	var tab flatbuffers.Table
	resp.Body(&tab)
	var dr tcproto.DirectoryResponse
	dr.Init(tab.Bytes, tab.Pos)
	dt := dr.Table()
	elem := dt.Vector(flatbuffers.UOffsetT(dt.Offset(vtableOffset(4))))
	flatbuffers.WriteUint32(frame[elem:], uint32(len(frame)))
	var m Response
	if err := DecodeResponse(frame, DecodeLimits{}, &m); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "string past") {
		t.Fatalf("an endpoint past the frame: %v", err)
	}
}
