package control

import (
	"errors"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// BatchID names a batch of the engine.
type BatchID uint64

// Resolver maps the segment ids of a request to segments.
type Resolver interface {
	Resolve(id xfer.SegmentID) (xfer.Segment, bool)
}

// SubmitOptions are the per-call options of Engine.Submit.
type SubmitOptions struct {
	Deadline time.Time
	Resolver Resolver
}

// TaskStatus is one task's state.
type TaskStatus struct {
	State       xfer.State
	Transferred uint64
	Err         error
}

// BatchSummary counts a batch's tasks by state.
type BatchSummary struct {
	Total, Waiting, Pending, Completed, Failed, Timeout, Canceled int
	Transferred                                                   uint64
}

// Engine errors the server matches.
var (
	ErrBatchNotFound = errors.New("xfer: batch not found")
	ErrBatchBusy     = errors.New("xfer: batch busy")
	ErrBatchFull     = errors.New("xfer: batch full")
)
