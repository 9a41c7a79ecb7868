// Package rdma is tensorcast's RDMA transport: RC queue pairs doing
// one-sided READ and WRITE over ibverbs.
//
// libibverbs is opened at run time (dlopen), never linked, so a binary built
// with cgo still starts on a host without it; Open then fails with
// ErrNoLibrary (which wraps xfer.ErrNotSupported) and the daemon runs with
// tcp only. Built without cgo, or off Linux, every constructor returns an
// error wrapping xfer.ErrNotSupported.
//
// The pieces, from the bottom:
//   - device discovery and RoCE v2 GID selection from sysfs (SelectGID),
//     with rdmamap for the device ↔ netdev map and port state;
//   - memory registration: a segment is registered once, in chunks
//     (Region), and its keys ride on the segment itself, in its RDMA slot
//     (Keys, xfer.SlotRDMA), so the hot path only looks ranges up;
//   - connection data (ConnInfo), a small binary struct the peer channel
//     carries, with INIT→RTR→RTS driven from it;
//   - the work-request plan (planner): tasks become linked lists of RDMA
//     READ/WRITE work requests with selective signalling;
//   - Transport, an xfer.Transport over a set of connected queue pairs,
//     each with its own completion queue, polled by the reactor that
//     posted (see "Who reaps");
//   - the verbs boundary under a Transport and a Region (QueuePair,
//     CompletionQueue, NewTransport, NewRegion): libibverbs implements it
//     in verbs_linux.go (its C side in verbs_linux.c), and package rdmatest
//     implements it in memory, so that the code above this package runs its
//     tests without a device.
//
// Package rdma/link builds the peer plane's RDMA side on this: one link
// per peer daemon over a Transport, and the registrations of the pools,
// client buffers and exports the links need.
//
// # Who reaps: completions polled by the reactor that posted
//
// The daemon's data path runs on reactor workers (package reactor). Each
// worker has a Home (Homes, Config.Homes), and a task the worker submits
// names it (xfer.Task.Home). Submit posts such a task on a queue pair
// whose completion queue that worker reaps: one it owns already, or one
// with nothing posted, which it then claims (only when every queue pair
// has another reaper's work in flight does it post beside that work,
// which that reaper then ends). The worker polls the completion queues of
// the queue pairs it owns after every pass of its loop (Home.Reap), and
// the tasks' Done run there, on its thread, posting the client's CQE: a
// request goes client → worker → NIC → worker → client, with no goroutine
// between.
//
// The worker's one sleep covers its completions too (Home.Sleep, a
// reactor.Reaper): with work in flight it keeps polling for PollSpin after
// its last post or completion (a round trip at low depth thus ends without
// any wake-up), then arms the completion queues it owns and sleeps; the
// completion event reaches the queue pair's goroutine, which sleeps on the
// completion channel and only wakes the worker (the worker's wake: its
// futex word, or its ring's eventfd). The worker, not that goroutine,
// then reaps.
//
// Ownership changes only while a queue pair has nothing posted (a claim
// in Submit), or when the transport takes the queue pair back (adopt):
// before it reconnects a queue pair, at Close, when a worker stops
// (Home.Stop) and when ibv_poll_cq fails. The queue pair's goroutine then
// reaps what is left, so a reactor that stopped or never comes back holds
// up neither a drain nor Close. Work no reactor submitted (Task.Home 0:
// the batch calls, stream tasks of goroutines, the connection probe) is
// reaped by the queue pair's goroutine, as is everything when there are
// no Homes. Reaping is done under the queue pair's lock, so each work
// request is retired once and each task ends once, by whichever reaper
// holds the queue pair; a queue pair error fails the work the owner reaps
// in order, each task with its own status.
//
// A worker never blocks in Submit for room its own completions would
// make: while it waits (up to SubmitWait) it reaps its queue pairs.
//
// The transport's logic is tested over rdmatest (fabric_test.go,
// home_test.go); real verbs over Soft-RoCE inside a VM: make test-rdma.
package rdma
