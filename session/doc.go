// Package session is what one client of tensorcastd holds, and the data
// plane it drives: the segments it registered (buffers, files) and opened
// (peers' segments), its pool blocks and the view of the pool its
// transfers resolve, its batches, its shared-memory queues (served by
// the host's reactor workers), its store session, and its exports and subscriptions. A
// Session is the resolver and range holder the transfer engine calls back
// for the client's requests, and the sink its queues' completions go to.
//
// Package control serves the protocol (listening, credentials, framing,
// fds, idempotency, audit) and dispatches each decoded request to the
// connection's Session; nothing here reads a socket or a frame. What the
// sessions of one server share is a Host.
//
// # Files
//
// session.go (Session, Host, Limits, Resolve), segments.go (buffers,
// files, pool blocks), blocks.go and poolview.go (the blocks a session
// holds and the holds transfers keep on them), batches.go (batches,
// transfers and the checks every request passes), queue.go (the queues
// as a reactor worker serves them), queue_store.go (the store's queue calls), store.go (the store's
// socket calls and the session's store session), exports.go (exports,
// subscriptions, notifications, remote segments), release.go (Close).
//
// # Goroutines and stop order
//
// A queue has no goroutine of its own: OpenQueue gives it to one of the
// host's reactor workers (package reactor), whose thread serves it
// (cqueue.Serve) until its close detaches it. Once closed, one goroutine
// unmaps its rings when the last transport has answered (or gives up when
// the server closes). Everything else runs on the connection's serving
// goroutine, or on the engine's and transports' goroutines through the
// callbacks below.
//
// Close stops a session in this order: its queues (close the ring, which
// fires the worker's armed wait; detach it from the worker, which returns
// once the worker no longer touches it; close the stream, so what is in
// flight ends Canceled with its CQE), its store session (pins, leases,
// reservations), its peers (the inbox, each export after the peer requests
// in its range, up to ReleaseWait; the remote segments), its batches
// (freed, or abandoned when still busy after ReleaseWait), its segments
// (unregistered and closed), then its pool blocks (freed; a block that
// transfers or peer requests are still in is freed by the last of them to
// end: the transfers' last DropRange, the peer requests' last Release).
//
// # Locks
//
//   - Session.mu guards the segment maps (buffers, files, remotes); segGen
//     changes under it whenever one is removed, which is how a queue's
//     cache of resolved segments learns.
//   - Session.qmu guards the queue map against stats scrapes.
//   - the session's pool blocks (Session.blocks, an xfer.Blocks) have
//     their own locks: the serving goroutine writes the blocks, workers
//     and the engine read them and keep holds on them (see xfer.Blocks).
//   - qstore.mu guards a queue's free store-call records.
//   - Host.mu guards the counters closed queues left behind. The server
//     takes its own lock, then a Session's qmu or the Host's mu.
//
// # A queue READ, end to end
//
// A client's READ of a pool range into its own buffer, submitted through
// a queue, is handled by four packages, client, queue, session and xfer
// (five with a transport of its own package: uring for a file, tcp for a
// peer's segment; a peer's segment over RDMA is six, rdma/link handing
// the task to rdma). The worker's thread runs the session's pass and holds
// no part of the request: reactor's loop, itself a guest of uring's poller
// where the daemon has io_uring. Three leaves hold none either and return
// at once: shm (the mappings' memory and references), faultcopy (the
// copy) and status (its code); a peer's target is routed by peer/plane
// and rdma/link (Route), which return the transport. The session resolves
// the request before the engine has it, and the engine's end goes to the
// queue; nothing calls back into the session: the engine holds and drops
// the pool range in the session's blocks, an xfer.Blocks (through an
// xfer.PoolView), and the segments' references are shm's. None of it
// lands in control or daemon. On the stack of the transport's Submit the
// packages are, outermost first, [uring,] reactor, session, xfer, each
// entered once (control's TestQueueReadPath); the end goes on down, xfer
// to queue, on whichever goroutine ends the task (the worker's own, for
// an inline copy or a file read its ring completed). A file's transport
// is the worker's own ring, so on a hosted worker uring is met twice: as
// the loop the thread runs in, and as the transport it submits to.
//
//  1. client, queue: the client writes the SQE into the submission ring
//     and, if the worker sleeps, wakes it (queue/doc.go has the wake-up
//     protocol).
//  2. session: on the reactor worker's thread, the queue's pass
//     (cqueue.Serve) takes the SQEs (DaemonRing.Take) into its own copy,
//     checks each and resolves both its segments (request, cqueue.resolve:
//     the pool view, or the session's buffer, a *shm.Buffer), publishes
//     sq_head and gives the requests to its stream (submit).
//  3. xfer: Stream.Submit takes the segments the request carries, holds
//     the pool range (xfer.Blocks.HoldRange), routes by the target's kind
//     (KindRouter: memory to the local transport) and dispatches.
//  4. xfer: the local transport copies the bytes between the two mappings
//     (faultcopy turns a fault into an error), inline or on its copy
//     workers, and ends the task (a file's read is the worker's own ring's:
//     the worker reaps it and ends the task on its thread).
//  5. xfer: the stream ends the request: its range hold drops
//     (xfer.Blocks.DropRange) and its sink, the queue's ring, is told
//     (DaemonRing.StreamDone).
//  6. queue: StreamDone takes the code of the state (status.ForState) and
//     posts the CQE (DaemonRing.Post), waking the client if it sleeps; the
//     client reaps it.
package session
