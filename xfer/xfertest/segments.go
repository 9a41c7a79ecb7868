package xfertest

import (
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

// Segments are a test's request segments by id, for a transport that finds
// what it needs on a task's segments (their registration slots, as the
// rdma transport finds its keys) rather than by id: Tasks gives each task
// the segments its request names.
type Segments map[xfer.SegmentID]*Segment

// Set puts reg in slot s of segment id, a segment of no bytes made on first
// use, and returns the segment. It fails the test when the slot is taken.
func (m Segments) Set(t testing.TB, id xfer.SegmentID, s xfer.RegSlot, reg xfer.Registration) *Segment {
	t.Helper()
	seg := m[id]
	if seg == nil {
		seg = SegmentOf(id, xfer.KindClient, nil)
		m[id] = seg
	}
	if !seg.Regs().Set(s, reg) {
		t.Fatalf("segment %d: registration slot %d is taken", id, s)
	}
	return seg
}

// Clear empties slot s of segment id, if it has one, without releasing
// what it held.
func (m Segments) Clear(id xfer.SegmentID, s xfer.RegSlot) {
	if seg := m[id]; seg != nil {
		if r := seg.Regs().Load(s); r != nil {
			seg.Regs().Drop(s, r)
		}
	}
}

// Tasks are tasks of reqs that end on c, with Local and Target the
// segments of m their request names (nil for an id m does not hold).
func (m Segments) Tasks(c xfer.Completer, reqs ...xfer.Request) []*xfer.Task {
	out := make([]*xfer.Task, len(reqs))
	for i, q := range reqs {
		out[i] = &xfer.Task{Req: q}
		if s := m[q.Local]; s != nil {
			out[i].Local = s
		}
		if s := m[q.Target]; s != nil {
			out[i].Target = s
		}
		out[i].SetCompleter(c)
	}
	return out
}
