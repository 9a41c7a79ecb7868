package xfertest

import "github.com/tensorcast/tensorcast/xfer"

// Func is a Completer that calls itself with every end: a test's own
// bookkeeping (a channel send, a counter) where a Recorder's is not it.
type Func func(t *xfer.Task, n uint64, err error)

var _ xfer.Completer = Func(nil)

// TaskDone implements xfer.Completer.
func (f Func) TaskDone(t *xfer.Task, n uint64, err error) { f(t, n, err) }

// Chan is a Completer that sends every end on itself, in the order they
// came: for a test or a benchmark driver that takes ends one by one
// without allocating. A full Chan blocks the transport that ends a task.
type Chan chan End

var _ xfer.Completer = Chan(nil)

// TaskDone implements xfer.Completer.
func (c Chan) TaskDone(t *xfer.Task, n uint64, err error) { c <- End{t, n, err} }
