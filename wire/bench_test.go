package wire

import (
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/xfer"
)

// benchCodec encodes and decodes m, a request, and the answer r b.N times.
func benchCodec(b *testing.B, m Request, r Response) {
	bld := flatbuffers.NewBuilder(0)
	var dm Request
	var dr Response
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := DecodeRequest(EncodeRequest(bld, &m)[FrameHeader:], DecodeLimits{}, &dm); err != nil {
			b.Fatal(err)
		}
		if err := DecodeResponse(EncodeResponse(bld, &r)[FrameHeader:], DecodeLimits{}, &dr); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}

// BenchmarkCodecTaskStatus is a TaskStatus call's two frames, each encoded
// and decoded.
func BenchmarkCodecTaskStatus(b *testing.B) {
	benchCodec(b, Request{Ctx: sampleCtx, Body: &TaskStatusRequest{Batch: 7, Index: 3}},
		Response{RequestID: 7, Body: &TaskStatusResponse{State: 3, Transferred: 4096}})
}

// BenchmarkCodecSubmit64 is a Submit of 64 requests and its answer.
func BenchmarkCodecSubmit64(b *testing.B) {
	reqs := make([]xfer.Request, 64)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: 5, LocalOffset: uint64(i) << 12, Target: 1, TargetOffset: uint64(i) << 16, Length: 4096}
	}
	benchCodec(b, Request{Ctx: sampleCtx, Body: &SubmitRequest{Batch: 7, Requests: reqs}},
		Response{RequestID: 7, Body: &SubmitResponse{Codes: make([]Code, 64)}})
}
