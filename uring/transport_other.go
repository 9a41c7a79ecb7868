//go:build !linux

package uring

import (
	"log/slog"

	"github.com/tensorcast/tensorcast/xfer"
)

// Transport is the io_uring transport; only Linux has one. Elsewhere New
// fails with ErrNotSupported and the methods do nothing.
type Transport struct{}

// File is a file segment of the io_uring transport (Linux only).
type File struct{}

// CQE is struct io_uring_cqe.
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

var (
	_ xfer.Transport = (*Transport)(nil)
	_ xfer.Segment   = (*File)(nil)
)

// New fails: io_uring is Linux only.
func New(cfg Config, log *slog.Logger) (*Transport, error) { return nil, ErrNotSupported }

func (t *Transport) Name() string                                  { return "uring" }
func (t *Transport) Submit(tasks []*xfer.Task) (int, error)        { return 0, ErrNotSupported }
func (t *Transport) Cancel(task *xfer.Task)                        {}
func (t *Transport) Close() error                                  { return nil }
func (t *Transport) Features() Features                            { return Features{} }
func (t *Transport) Stats() []RingStats                            { return nil }
func (t *Transport) Health() error                                 { return nil }
func (t *Transport) RegisterBuffers(segs ...xfer.MemSegment) error { return ErrNotSupported }
func (t *Transport) UnregisterBuffers(ids ...xfer.SegmentID) error { return ErrNotSupported }
func (t *Transport) OpenFile(id xfer.SegmentID, path string, opts FileOptions) (*File, error) {
	return nil, ErrNotSupported
}

func (f *File) ID() xfer.SegmentID                 { return 0 }
func (f *File) Kind() xfer.Kind                    { return xfer.KindFile }
func (f *File) Size() uint64                       { return 0 }
func (f *File) Path() string                       { return "" }
func (f *File) Direct() bool                       { return false }
func (f *File) Alignment() (offset, memory uint32) { return 1, 1 }
func (f *File) Fixed() bool                        { return false }
func (f *File) Acquire() bool                      { return false }
func (f *File) Release()                           {}
func (f *File) Close() error                       { return nil }

// Rings is 0: there is no ring to host a guest.
func (t *Transport) Rings() int { return 0 }

// Wakeable reports false: there is no ring to host a guest.
func (t *Transport) Wakeable() bool { return false }

// Host fails: io_uring is Linux only.
func (t *Transport) Host(i int, g Guest) (func(), error) { return nil, ErrNotSupported }
