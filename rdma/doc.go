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
// any wake-up), then sleeps. The protocol, for each queue pair it owns
// with work in flight:
//
//  1. arm the completion queue (ibv_req_notify_cq), unless armed since
//     its last event;
//  2. put a one-shot poll of the completion channel's fd for POLLIN on
//     the worker's own io_uring ring (IORING_OP_POLL_ADD, through
//     reactor.ReaperWaits), unless one is there already: it stays across
//     sleeps until it fires;
//  3. poll the completion queue once more: a completion that came before
//     step 1 raised no event, so if one is there the worker does not
//     sleep;
//  4. sleep in the ring's one io_uring_enter, with the client doorbells;
//  5. woken by the poll (Home.Fired), take the channel's events
//     (ibv_get_cq_event, non-blocking, acknowledged in batches: else the
//     channel stays readable and the next poll fires at once), poll the
//     queue to empty, ending the tasks on this thread, and start again at
//     1 before the next sleep.
//
// The completion thus ends the worker's sleep directly: no goroutine
// between the NIC's completion and the client's CQE. Each step that
// changes the queue pair's state runs under its lock, and the poll is
// level-triggered at arm (a channel readable already fires at once), so no
// event is lost between steps.
//
// One watcher per channel: while such a worker owns a queue pair, the
// queue pair's goroutine leaves the channel alone and sleeps until woken
// (CompletionQueue.Wait(false)); it watches the channel while it owns the
// queue pair itself, or while its owner's worker cannot poll (a worker on
// its own thread, whose futex_waitv cannot wait on a file; a home whose
// poll failed, which turns its polling off). Then the event reaches the
// goroutine, which only wakes the worker (its futex word, or its ring's
// eventfd), and the worker, not that goroutine, reaps. A claim that
// changes who watches wakes the goroutine to wait again; until it has, it
// may take an event meant for the worker, and then wakes the worker, so a
// change of hands costs a hand-off and never a completion. A poll left
// on the ring for a queue pair the worker no longer owns is cancelled at
// its next sleep; one that fires for it is ignored (its token's
// generation moved on).
//
// Ownership changes only while a queue pair has nothing posted (a claim
// in Submit), or when the transport takes the queue pair back (adopt):
// before it reconnects a queue pair, at Close, when a worker stops
// (Home.Stop) and when ibv_poll_cq fails. The queue pair's goroutine then
// reaps what is left, so a reactor that stopped or never comes back holds
// up neither a drain nor Close. Work no reactor submitted (Task.Home 0:
// the batch calls, the store's L2 I/O, stream tasks of goroutines, the
// connection probe) is posted on a queue pair its goroutine owns, or
// claims while it is idle, and reaped there, as is everything when there
// are no Homes; only when every queue pair has a worker's work in flight
// is it posted beside that work, and that worker reaps it with its own
// (it sleeps only after arming and polling that queue pair, which has
// work in flight, so it is woken for it). Exactly one reaper per
// completion queue at any time: the owner. Reaping is done under the queue pair's lock, so each work
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
