package session

import (
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// The engine types a session's Engine interface speaks; *xfer.Engine
// implements it.
type (
	BatchID       = xfer.BatchID
	Resolver      = xfer.Resolver
	SubmitOptions = xfer.SubmitOptions
	TaskStatus    = xfer.TaskStatus
	BatchSummary  = xfer.BatchSummary
)

// Engine errors the server matches.
var (
	ErrBatchNotFound = xfer.ErrBatchNotFound
	ErrBatchBusy     = xfer.ErrBatchBusy
	ErrBatchFull     = xfer.ErrBatchFull
)

var (
	_ Engine   = (*xfer.Engine)(nil)
	_ Registry = (*xfer.Registry)(nil)
)

var _ Pool = (*shm.Pool)(nil)
