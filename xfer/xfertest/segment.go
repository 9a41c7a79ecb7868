package xfertest

import (
	"sync/atomic"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

// Segment is an xfer.MemSegment over a byte slice that counts its
// references. Once closed, Acquire fails, as it does for a segment that is
// closing; a Release below zero is recorded for CheckRefs.
type Segment struct {
	id      xfer.SegmentID
	kind    xfer.Kind
	buf     []byte
	refs    atomic.Int64
	under   atomic.Bool
	closing atomic.Bool
	regs    xfer.Regs
}

var (
	_ xfer.MemSegment = (*Segment)(nil)
	_ xfer.Registered = (*Segment)(nil)
)

// NewSegment returns a pool segment of size zeroed bytes.
func NewSegment(id xfer.SegmentID, size int) *Segment {
	return SegmentOf(id, xfer.KindPool, make([]byte, size))
}

// SegmentOf returns a segment of kind over buf (which may be nil: a
// segment with no bytes).
func SegmentOf(id xfer.SegmentID, kind xfer.Kind, buf []byte) *Segment {
	return &Segment{id: id, kind: kind, buf: buf}
}

func (s *Segment) ID() xfer.SegmentID { return s.id }
func (s *Segment) Kind() xfer.Kind    { return s.kind }
func (s *Segment) Size() uint64       { return uint64(len(s.buf)) }
func (s *Segment) Bytes() []byte      { return s.buf }

// Regs are the registrations transports set on the segment. Nothing tears
// them down: a test that checks their release calls Regs().Teardown().
func (s *Segment) Regs() *xfer.Regs { return &s.regs }

// Acquire takes a reference unless the segment is closed.
func (s *Segment) Acquire() bool {
	if s.closing.Load() {
		return false
	}
	s.refs.Add(1)
	return true
}

// Release drops a reference, recording a drop below zero.
func (s *Segment) Release() {
	if s.refs.Add(-1) < 0 {
		s.under.Store(true)
	}
}

// Close makes every later Acquire fail. It does not wait for the
// references held.
func (s *Segment) Close() error {
	s.closing.Store(true)
	return nil
}

// Refs is the number of references held.
func (s *Segment) Refs() int64 { return s.refs.Load() }

// Underflowed reports whether a Release ever dropped the count below zero.
func (s *Segment) Underflowed() bool { return s.under.Load() }

// CheckRefs fails t unless every segment is back to zero references and
// none was ever released below zero.
func CheckRefs(t testing.TB, segs ...*Segment) {
	t.Helper()
	for _, s := range segs {
		if r := s.refs.Load(); r != 0 {
			t.Errorf("segment %d: %d refs outstanding, want 0", s.id, r)
		}
		if s.under.Load() {
			t.Errorf("segment %d: released below zero", s.id)
		}
	}
}
