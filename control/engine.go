package control

import "github.com/tensorcast/tensorcast/xfer"

// Engine errors the server maps to codes.
var (
	ErrBatchNotFound = xfer.ErrBatchNotFound
	ErrBatchBusy     = xfer.ErrBatchBusy
	ErrBatchFull     = xfer.ErrBatchFull
)

// The engine types the Engine interface speaks.
type (
	BatchID       = xfer.BatchID
	Resolver      = xfer.Resolver
	SubmitOptions = xfer.SubmitOptions
	TaskStatus    = xfer.TaskStatus
	BatchSummary  = xfer.BatchSummary
)
