// Package queue is the data path between a client and tensorcastd: a
// submission ring and a completion ring in one shared, sealed memfd, with
// wake-ups that are never lost and no system call while both sides are busy.
//
// The daemon creates a queue (OpenQueue on the control socket), maps it and
// passes its memfd to the client with SCM_RIGHTS; both map it shared. The
// client writes submission entries (SQEs) and reads completion entries
// (CQEs); the daemon reads SQEs and writes CQEs. [DaemonRing] is the
// daemon's side, [ClientRing] the client's; both are plain Go over the
// mapping, with the futex calls in futex_linux.go.
//
// # Layout
//
// All integers are little-endian. Offsets are from the start of the mapping.
//
//	0x000  u32 magic "TCQ1" (0x31514354)     0x004  u32 version (1)
//	0x008  u32 sq_entries (power of two)      0x00c  u32 cq_entries (power of two, >= 2 * sq_entries)
//	0x010  u32 sqe_size (64)                  0x014  u32 cqe_size (32)
//	0x018  u32 sq_off                         0x01c  u32 cq_off
//	0x020  u32 data_off                       0x024  u32 data_size
//	0x028  u64 size of the whole mapping      0x030  u64 queue id
//	0x038  u32 doorbell   written by the daemon: 0 futex, 1 eventfd (see Wake-ups)
//	0x03c  u32 bell_ack   written by the client: 1 when it rings the eventfd
//	0x040  u32 sq_head    written by the daemon, read by the client
//	0x080  u32 sq_tail    written by the client, read by the daemon
//	0x0c0  u32 sq_flags   set by the daemon before it sleeps (FlagNeedWakeup, FlagCQWait)
//	0x0c4  u32 sq_wake    the futex word the daemon sleeps on
//	0x100  u32 cq_head    written by the client, read by the daemon
//	0x140  u32 cq_tail    written by the daemon, read by the client
//	0x180  u32 cq_flags   set by the client before it sleeps (FlagWaiting)
//	0x184  u32 cq_wake    the futex word the client sleeps on
//	0x188  u32 cq_target  written by the client before it sleeps with FlagWaitTarget
//	0x1c0  u32 state      written by the daemon: StateClosed, StateBroken
//	0x1c4  u32 violations written by the daemon: entries or indices it refused
//	sq_off   sq_entries SQEs of 64 bytes
//	cq_off   cq_entries CQEs of 32 bytes
//	data_off data_size bytes the client manages: notification payloads, keys
//
// The state and violations words are the daemon's record published for the
// client: the daemon keeps its own copy and never reads them back, so what
// it reports cannot be set by the client.
//
// Each index is a free-running u32; entry i lives at i & (entries-1). A
// side writes its own index after the entries it covers with a
// sequentially consistent atomic write (the Go side uses a swap, a
// read-modify-write, so that it is a full fence under every
// implementation, the race detector's included), and reads the other
// side's with an atomic load (acquire).
//
// # Entries
//
// An SQE (64 bytes): u8 op, u8 flags, u16 count (store ops; 0 otherwise),
// u32 timeout in microseconds (0: the queue's default), u64 user_data, u64 local segment,
// u64 local offset, u64 target segment, u64 target offset, u64 length,
// u32 notification offset and u32 notification length in the data area
// (with SQEFlagNotify). A CQE (32 bytes): u64 user_data, u64 result (bytes
// moved), u32 code (the control protocol's status codes), u8 task state,
// 11 bytes reserved.
//
// The daemon takes an SQE by copying it (and the data it references) into
// its own memory and only then validating the copy; once sq_head has passed
// an entry the client may reuse it and the data it referenced. Every SQE the
// daemon takes yields exactly one CQE, in no particular order: user_data
// says which.
//
// # Store calls
//
// Ops from 16 on (OpStoreFirst) are calls of the KV block store. Their keys
// travel in the data area, their per-key results come back in a region of a
// client buffer the SQE names, so that the client owns the results'
// lifetime:
//
//	op          16 GET, 17 RESERVE, 18 COMMIT, 19 EXISTS, 20 LOOKUP_PREFIX, 21 UNPIN
//	flags       SQEFlagDurable (0x2) on COMMIT, SQEFlagPin (0x4) on
//	            LOOKUP_PREFIX; no other bit
//	count       the number of keys, 1..65535 (the daemon's
//	            store_max_keys_per_call bounds it further)
//	timeout     ignored: a store call has no deadline
//	local       the results region's segment: a client buffer of the
//	            connection (0 for LOOKUP_PREFIX, which has no region)
//	local_off   its offset in that buffer, a multiple of 8; count * 16 bytes
//	            from there must lie inside the buffer, checked as a
//	            transfer's local side is
//	target, target_off  0
//	length      RESERVE: the size of every key's value; 0 otherwise
//	notify_off, notify_len  the key list in the data area: count keys,
//	            each a u16 little-endian length and then its bytes,
//	            nothing between keys and nothing after the last
//
// The daemon copies the key list out of the data area before it parses,
// validates or uses a byte of it, and the store copies what it keeps: a key
// the client rewrites while the call runs changes nothing the daemon does.
//
// The results region holds one 16-byte record per key, positionally:
//
//	0   u8   code (the control protocol's status codes)
//	1   u8×3 zero
//	4   u32  GET: the value's length; RESERVE: the size reserved; else 0
//	8   u64  GET, RESERVE: the value's offset in the pool; else 0
//
// The daemon writes every record before it posts the CQE (for a durable
// COMMIT or a GET that promotes from L2, once the store's asynchronous
// completion came; the worker never waits for the device), and never reads
// them. A client fills each record's code with StoreUnwritten (0xff)
// before it submits: a record that still holds it, or whose zero bytes are
// not zero, is a short answer, and so is a count of OK records other than
// the CQE's result; the whole call then failed.
//
// The CQE's code is the whole call's: OK when the call ran (each key's code
// says what happened to it); FAILED_PRECONDITION when an all-or-nothing
// UNPIN was refused (its records say which keys refused it, the others
// carry FAILED_PRECONDITION: nothing changed); another code when the call
// failed as a whole (the records, when the region was valid, all carry
// it), or when the SQE itself was refused (a bad op, flag, count, region
// or key list: nothing is written). Its result is the number of keys whose
// code is OK, or for LOOKUP_PREFIX the length of the prefix found (and,
// with SQEFlagPin, pinned). Its state is COMPLETED with OK, else FAILED.
// Pins a GET or LOOKUP_PREFIX took belong to the connection and go with
// it; UNPIN releases them one by one.
//
// # Wake-ups
//
// Each side sleeps on the other side's doorbell when it runs out of work
// (the client after a brief spin). Before sleeping it reads its futex word,
// sets its flag with an atomic read-modify-write (a full fence) and checks
// once more for work; only then does it wait on the futex word with the
// value it read. The other side publishes its index (a full fence), then
// reads the flag; if the flag is set it clears it, bumps the futex word and
// wakes it. Either the sleeper sees the new index, or the waker sees the
// flag and the changed word makes the sleeper's wait return at once: a
// wake-up is never lost. While both sides are busy no flag is set, and no
// system call is made.
//
// The daemon sets FlagNeedWakeup when it sleeps for want of entries and
// FlagCQWait when it sleeps for want of completion-ring space (the client
// then rings after reaping). The client sets FlagWaiting when it sleeps for
// completions. A client that waits for several sets FlagWaitTarget with
// it, after writing to cq_target the cq_tail it waits for: the daemon then
// wakes it only once cq_tail reaches that index, or when the CQE it posts
// leaves nothing in flight (no more will come), instead of once per CQE,
// each of which would send the client back to sleep. A target that is
// never reached therefore costs the client only its own wait.
//
// The library's client spins for a last missing completion: one that waits
// for two or more sleeps at once with its target at the last, since the
// daemon is known to be working on them, and a spin through their arrivals
// would bill the whole wait to the client's CPU. Its spin is learned
// (queue/spin.go) and never longer than 50 µs. The exception is a stream of
// completions that come at memory speed (at most 6.25 µs apart: the local
// engine's 64 KiB copies): there the client's own wake-up (tens of
// microseconds on a small virtual host) is longer than the rest of its
// wait, and the daemon idles through it, so the client sets its target some
// completions before the last, about 100 µs' worth, and spins for those (at
// most 200 µs; a spin that runs out turns this off for a growing number of
// waits). In a wait for part of what is in flight, where the daemon keeps
// working whatever the client does and a spin saves only a wake-up, it is
// 25 µs' worth and at most 50 µs. Completions that come slower, up to 100
// µs apart (the local engine's 1 MiB copies), for a wait that covers
// everything the client has in flight, get the same by a learnt lead: the
// client is woken one before the last, and a wake-up that finds the last
// there already (the daemon idled meanwhile) makes the next one earlier by
// one, up to 100 µs' worth; one that finds none of its lead come makes it
// later by one. The target is only the client's word: the daemon's side is
// the same.
//
// Before a wait for several that leaves more in flight, while the daemon's
// worker is busy (no Submit since the last wait found FlagNeedWakeup set,
// and it is not set now), the client may nap: a sleep on the clock with no
// flag set, so the daemon makes no system call for it, until about when the
// last completion it waits for is due, less how late its timed sleeps end;
// a rest due within 25 µs is spun for, 50 µs at most (a spin that runs out
// backs these spins off, as the tail spins above), and only what is still
// missing then is waited for as above. A futex wake of a sleeping thread
// costs the waker 2-10 µs on a two-CPU virtual host, and the daemon's busy
// worker is that waker; the completions beyond the wait keep it busy while
// the client naps. A doorbell after a wait that napped (the worker ran dry
// and slept) backs naps off for a growing number of waits (queue/spin.go).
// A nap is invisible to the protocol: with no flag set there is nothing to
// lose. The C library's wait (c/src/queue.c, its rules in c/src/tail.c)
// does the same, so a C or Python engine costs the worker no more than a Go
// client.
//
// The Go library's sleep is futex waits of at most 5 ms (sleepOn), its flag
// and target set throughout: the Go runtime's monitor takes the processor
// of a thread that stays 10 ms in one system call and then polls every 20
// µs for a while, which cost a client waiting on 14 ms remote gets half of
// its CPU. Between two waits the word is re-read by the kernel, so a wake-up
// made between them ends the next at once: nothing changes for the daemon.
//
// # Eventfd doorbells
//
// A worker whose io_uring cannot wait on a futex (no IORING_OP_FUTEX_WAIT,
// before Linux 6.7; or reactor.Config.Doorbell set to eventfd) still
// sleeps on its ring, on an eventfd per queue. The daemon then writes 1
// into the header's doorbell word and passes the queue's eventfd with
// OpenQueue's answer, after the memfd (SCM_RIGHTS, one message). The
// client that takes it writes 1 to bell_ack and, where the protocol above
// says "bumps the futex word and wakes it", bumps sq_wake and writes the
// 8-byte value 1 to the eventfd instead of FUTEX_WAKE. The worker keeps a
// read of the eventfd armed in its ring (IORING_OP_READ) across its
// sleeps until it completes; the eventfd's count holds a write made
// before the read was armed, so the order of flag, re-check and ring is
// the same as with the futex and no wake-up is lost.
//
// The daemon never writes that eventfd: the client shares its file
// description and could make a write block. The daemon's own wake-ups of
// the worker (Kick, Close) go through the worker's own wake-up instead.
// What a client does with it costs only its own queue: a client that
// does not say it rings it (bell_ack), or whose eventfd the worker's read
// fails on (a kernel that answered a non-blocking file's read with EAGAIN
// at once; 6.1 and 6.18 wait on it as on any other), has its queue looked
// at every millisecond by the worker instead (counted as the worker's deaf
// sleeps, and logged); one that drains or floods it delays or wakes only
// the worker's look at its own queue. When the queue closes, the worker
// cancels its armed read (IORING_OP_ASYNC_CANCEL by user_data), since
// nothing else would end it.
//
// # The daemon's side: one sleep per reactor
//
// The daemon serves its queues with a few reactor workers (package
// reactor), each serving many queues, and a worker has one sleep for all
// of them and for its io_uring ring. The first half of the sleep above is
// per queue (DaemonRing.Doorbell: read sq_wake, set the flag, re-check);
// the wait itself is the worker's: it arms, for every queue whose Doorbell
// agreed, a futex wait on that queue's sq_wake with the value Doorbell
// read (IORING_OP_FUTEX_WAIT on its ring, a shared futex, so the client's
// plain FUTEX_WAKE of its own mapping reaches it; a read of the queue's
// eventfd with eventfd doorbells; futex_waitv(2) without io_uring), then
// waits once for the first of: any armed word woken or
// changed, a completion on its ring, a completion of the RDMA work it
// posted, its own wake-up (a queue attached or detached, shutdown). A
// queue for which Doorbell found work (or closing) keeps the worker awake,
// and so does RDMA work it posted that is in flight, for a short spin after
// its last post or completion (rdma.Config.PollSpin). After that the
// worker, before it sleeps, arms each completion queue it has work on
// (ibv_req_notify_cq) and puts a one-shot IORING_OP_POLL_ADD of that
// queue's completion channel on its own ring (once: the poll stays there
// across sleeps until it fires), then polls each completion queue once
// more, and does not sleep if that found anything: a completion before the
// arm raises no event. A completion after the arm does: the channel turns
// readable and the poll ends the worker's one io_uring_enter, with no
// other thread between. Awake, the worker takes the channel's events
// (ibv_get_cq_event, acknowledged in batches), polls the queue to empty
// and, if work is still in flight, arms and polls again before its next
// sleep (package rdma, "Who reaps"). A worker on its own thread
// (futex_waitv) cannot poll a file: there the queue pair's goroutine
// waits on the channel and ends the worker's sleep through its own
// wake-up. The doorbell half is unchanged by this. Once awake, the worker
// clears the flags it set (DaemonRing.Awake), so a busy worker costs its
// clients no doorbell.
//
// The client's side is unchanged by this, and so is the protocol on the
// wire: the same words, flags and futex calls. An armed wait stays in the
// ring across the worker's sleeps until it fires: a doorbell, a Kick or
// Close (which bump sq_wake and wake it), so a worker re-arms a queue only
// when sq_wake moved. A word that moved without a wake-up reaching the
// armed wait (a client that writes sq_wake and rings nobody) is not armed
// a second time: the worker's sleep is bounded to a millisecond instead,
// so what a client writes costs at most its own queue's latency and
// never piles waits up in the kernel. A worker that has just answered
// its queues' last requests, with nothing of its ring's in flight, looks
// for new entries for a bounded time (data_poll, 50 µs; reactor/poll.go)
// before it goes through the above: meanwhile no flag is set, so a client
// that submits then rings nothing, and the worker takes its entries on its
// next look. Two such polls in a row that found nothing make it sleep at
// once, but one idle turn in sixteen, until a poll finds entries again;
// polls take at most half of each 10 ms, whatever the clients submit.
//
// # Hostile memory
//
// The client can write anything anywhere in the mapping at any time. The
// daemon never reads back the header's geometry (it keeps its own), copies
// each SQE with atomic loads before it looks at it, refuses an index that
// claims more entries than the ring holds (counting a violation, taking
// nothing), and never posts more CQEs than the ring can hold: an SQE is
// taken only when a CQE slot is free for it, counting those in flight. A
// client that stops reaping gets backpressure, never a lost completion, and
// nothing it writes reaches another client.
package queue
