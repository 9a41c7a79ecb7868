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
//	0x040  u32 sq_head    written by the daemon, read by the client
//	0x080  u32 sq_tail    written by the client, read by the daemon
//	0x0c0  u32 sq_flags   set by the daemon before it sleeps (FlagNeedWakeup, FlagCQWait)
//	0x0c4  u32 sq_wake    the futex word the daemon sleeps on
//	0x100  u32 cq_head    written by the client, read by the daemon
//	0x140  u32 cq_tail    written by the daemon, read by the client
//	0x180  u32 cq_flags   set by the client before it sleeps (FlagWaiting)
//	0x184  u32 cq_wake    the futex word the client sleeps on
//	0x1c0  u32 state      written by the daemon: StateClosed, StateBroken
//	0x1c4  u32 violations written by the daemon: entries or indices it refused
//	sq_off   sq_entries SQEs of 64 bytes
//	cq_off   cq_entries CQEs of 32 bytes
//	data_off data_size bytes the client manages: notification payloads, keys
//
// Each index is a free-running u32; entry i lives at i & (entries-1). A
// side writes its own index with a sequentially consistent atomic store
// (release at least) after the entries it covers, and reads the other
// side's with an atomic load (acquire).
//
// # Entries
//
// An SQE (64 bytes): u8 op, u8 flags, u16 reserved, u32 timeout in
// microseconds (0: the queue's default), u64 user_data, u64 local segment,
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
// # Wake-ups
//
// Each side spins briefly when it runs out of work, then sleeps on the other
// side's doorbell. Before sleeping it reads its futex word, sets its flag,
// (the atomic store is a full fence) and checks once more for work; only
// then does it wait on the futex word with the value it read. The other side
// publishes its index (a full fence), then reads the flag; if the flag is
// set it clears it, bumps the futex word and wakes it. Either the sleeper
// sees the new index, or the waker sees the flag and the changed word makes
// the sleeper's wait return at once: a wake-up is never lost. While both
// sides are busy no flag is set, and no system call is made.
//
// The daemon sets FlagNeedWakeup when it sleeps for want of entries and
// FlagCQWait when it sleeps for want of completion-ring space (the client
// then rings after reaping). The client sets FlagWaiting when it sleeps for
// completions.
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
