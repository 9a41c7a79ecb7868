// Package reactor serves the daemon's client queues with a small fixed set
// of workers, each a goroutine locked to its OS thread that owns the
// queues assigned to it for their life and, on Linux with io_uring, the
// ring it sleeps and does its file I/O in.
//
// A worker's one loop takes each queue's SQEs, checks them and submits
// them to the transfer engine (Queue.Serve); what a transport of the
// worker's ring completes comes back on the same thread, which posts the
// CQE. A request to a file thus goes client → worker → kernel → worker →
// client, and crosses no other goroutine.
//
// # Hosting
//
// With the io_uring transport, worker i is the guest of ring i
// (uring.Transport.Host): the ring's poller is the worker's thread. Its
// pass serves the worker's queues first, then submits what they queued on
// the ring and reaps the ring's completions. Without io_uring (another
// system, a kernel without it), each worker runs its own locked goroutine
// with the same passes, and sleeps in futex_waitv(2) instead.
//
// # One sleep
//
// An idle worker sleeps in one wait that any of its sources ends: the
// doorbell of each queue it serves (the queue's futex word, armed as an
// IORING_OP_FUTEX_WAIT on the ring, or among the words of futex_waitv; on
// a ring without IORING_OP_FUTEX_WAIT, a read of the queue's eventfd,
// which the client writes: see "Doorbells"),
// its ring's completions, its reapers' completion channels (polled on the
// ring, see "Reapers"), and its own wake-up (a queue attached or
// detached, the pool stopping, a reaper's completion on an own-thread
// worker: the ring's eventfd, or the worker's own futex word). Before it sleeps it asks every queue for its doorbell
// (Queue.Doorbell), which sets the queue's NEED_WAKEUP flag and re-checks,
// as queue/doc.go says: a client that submits after the check sees the
// flag, changes the word and wakes the wait; one that submitted before is
// seen by the check, and the worker does not sleep.
//
// A worker that had work within the last second sleeps at most 8 ms at a
// time (a hosted worker only with none of its ring's I/O in flight): the Go
// runtime's monitor takes the processor of a thread that stays 10 ms in
// one system call, and its next wake-up then sets it polling every 20 µs
// for a millisecond or more, which cost a daemon answering a request every
// 20 ms most of its CPU (uring.BusySleep). For the same monitor, the
// worker's thread passes through the Go scheduler every 5 ms while it
// works, and before a bounded sleep once a millisecond has passed since
// it last did (uring.YieldDue): a thread that only makes system calls
// never does, and 10 ms without it reads as a goroutine running too long.
// Idle for longer, it sleeps unbounded. A bounded sleep that runs out is a
// pass like any other.
//
// # Polling
//
// A worker whose pass answered its queues' last requests in flight, with
// nothing of its ring's in flight either, looks for their clients' next
// submissions for Config.Poll (50 µs) before it prepares that sleep
// (poll.go): a client that reaps and submits again within it costs the
// worker no wake-up and rings no doorbell (no NEED_WAKEUP is set while the
// worker polls). Requests in flight end with a completion that wakes the
// worker anyway, so it never polls through them. Two polls in a row that
// found nothing stop it polling but one idle turn in sixteen, until a
// poll finds work again: an idle client costs at most that. Whatever the
// clients do, polls take at most half of each 10 ms: a client that keeps
// submitting just before each poll would end costs its worker at most
// half a core, then a wake-up per submission (Stats.PollsCapped).
//
// # Doorbells
//
// New picks, once, how clients wake a hosted worker (Config.Doorbell,
// logged): the queue's futex word where the kernel's io_uring has
// IORING_OP_FUTEX_WAIT (Linux 6.7), else an eventfd per queue
// (queue.DaemonRing.UseEventfd; queue/doc.go, "Eventfd doorbells"), so
// that on older kernels too a worker sleeps on its ring and does its file
// I/O there, without a hand-off. Asking for futex doorbells where the ring
// cannot wait on them runs the workers on their own threads (futex_waitv)
// instead. A worker arms each queue's eventfd read once and keeps it armed
// across sleeps until it completes; a queue whose doorbell cannot be heard
// (its client does not ring it, or its read failed) bounds the worker's
// sleep to a millisecond instead (Stats.Deaf). A queue detached with a
// wait armed (its read, or its futex wait) has it cancelled at the
// worker's next sleep.
//
// # Reapers
//
// A transport whose requests the worker posts and whose completions the
// worker reaps itself (the rdma transport's Homes) gives the worker a
// Reaper (AddReaper): the worker runs its Reap after every pass, and asks
// its Sleep before it sleeps, which arms the reaper's wake-up or keeps the
// worker polling a little longer. A hosted worker lends its reapers its
// ring (ReaperWaits): a reaper arms a one-shot poll of its completion
// channel there, so that a completion ends the worker's one sleep like a
// doorbell does, and the poll's end comes back to the reaper's Fired with
// its own token (a token's top bit says "a reaper's", the next seven
// which one, so a worker serves fewer than 32767 queues and has at most
// 128 reapers). An own-thread worker lends none: its reapers' transports
// then call the wake-up Bind gave. A stopping worker stops its reapers,
// which hand what they had in flight back to their transports.
//
// # Assignment
//
// Attach gives a new queue to the worker serving the fewest; a queue stays
// on that worker until Detach. Detach returns once the worker no longer
// touches the queue (the caller then owns what the queue's worker side
// held), at once if the worker has stopped.
//
// # Goroutines and stop order
//
// A hosted worker has no goroutine of its own: its ring's poller serves it
// until the transport closes (Guest.Stop). An own-thread worker's
// goroutine is started by New and stopped by Close: mark stopped, wake,
// wait for the goroutine. A stopped worker serves nothing: queues still
// attached are left to their owners, whose Detach then returns at once.
package reactor
