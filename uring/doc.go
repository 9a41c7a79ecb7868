// Package uring is tensorcast's io_uring transport: it moves bytes between
// memory segments (the daemon's pool, clients' buffers) and files or block
// devices on local NVMe, with O_DIRECT, registered (fixed) buffers and files,
// batched submission and batched completion reaping.
//
// Shape: a Transport owns Config.Rings rings. Each ring has one poller
// goroutine, locked to its OS thread, that is the ring's only issuer: it
// creates the ring (so SINGLE_ISSUER and DEFER_TASKRUN apply), registers
// buffers and files on it, turns dispatched tasks into SQEs and calls
// Task.Done for what completes. It works in small steps (Config.Batch):
// reap a few completions, end their tasks, hand the kernel what those Done
// callbacks and Submit queued, a few SQEs per io_uring_enter, and sleep in
// the kernel only when the CQ is empty and nothing waits to be submitted.
// Requests that complete together are thus not resubmitted together in
// one burst, which a device then also serves and completes as one.
// Submit, from any goroutine, validates tasks, takes a slot from the ring's
// preallocated slot table and queues the slot for the poller, waking it
// through an eventfd only when it sleeps in the kernel. There is no
// goroutine per request and no allocation per request at steady state.
//
// A ring per reactor: a ring's poller can host a Guest (Transport.Host),
// a reactor worker with its client queues (package reactor). Each pass
// serves the guest first, on the poller's thread; what the guest submits
// names this ring (xfer.Task.Home) and goes into the same pass's
// submission, without an eventfd wake-up, and its completions come back to
// the guest on the same thread. When the ring would sleep, the guest arms
// its queues' doorbells as IORING_OP_FUTEX_WAIT SQEs (Waits), or, where
// the kernel lacks that opcode, as reads of the queues' eventfds
// (Waits.FDWait), so that one io_uring_enter waits for the ring's
// completions, the doorbells and the eventfd alike. The store's L2 I/O and the batch calls submit from their
// own goroutines to the same rings, round robin.
//
// Stop order (Close): mark closed so Submit refuses new work, wake every
// poller, each poller stops its guest (Guest.Stop), ends queued tasks with xfer.ErrClosed, cancels what is
// in flight (IORING_OP_ASYNC_CANCEL), reaps until nothing is in flight or
// Config.DrainTimeout passes, unmaps and closes its ring and exits; Close
// waits for every poller, then closes the files opened through it.
//
// Task.Tag, for this transport, names the slot a dispatched task holds:
// the ring's index in the transport in the high 32 bits, the slot's index
// in that ring's slot table in the low 32. Submit writes it when it takes
// the slot; Cancel decodes it and acts only if that slot still holds the
// task (it may have completed and been reused). A data SQE's user_data is
// the slot's index and its generation (bumped each time the slot takes a
// task), and Cancel records the generation too: a completion or a cancel
// meant for a slot's earlier task never reaches the one it holds now.
//
// Only Linux has io_uring; elsewhere New returns an error matching
// xfer.ErrNotSupported.
package uring
