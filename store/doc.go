// Package store is tensorcast's tiered KV block store: values under keys
// (up to 256 bytes), each value one block of the daemon's DRAM pool (L1)
// and/or one slot of a file or block device on NVMe (L2), moved through an
// xfer.Transport (the io_uring transport, with the pool registered as fixed
// buffers, so promotions and writebacks are READ_FIXED / WRITE_FIXED
// straight between the device and the pool's pages).
//
// # Calls
//
// Every call is a batch with positional results: codes[i] is the outcome of
// keys[i], exactly one per key on every call, in the control protocol's
// codes (Code). An optional errs slice receives the detail behind each
// code. A returned error is about the call as a whole (see ops.go).
//
// A Session (one per client connection) owns pins, leases and reservations;
// Session.Close releases all of them (and Session.Abort its reservations of
// some keys, before then). Neither can be evicted, so each is bounded per
// session, in bytes at block size: its reservations by
// Config.MaxSessionReserved, the values it holds pinned by
// Config.MaxSessionPinned (a value pinned more than once counts once). One
// client's calls then never take L1 from the others' puts.
//
//	Reserve, Commit   zero-copy put: pool blocks for the client to write in
//	                  place, then made visible (durable: on L2 first)
//	Abort             gives reservations back uncommitted (their blocks
//	                  freed at once, as a closing session frees them)
//	Put               copying put from caller-owned buffers
//	Get               pin and return pool locations (promoting L2-only keys)
//	Store.Read        copy into caller-owned buffers (promoting likewise)
//	Store.Exists      presence; renews and moves nothing
//	LookupPrefix      how many leading keys are present; with pin, pins them
//	                  in the same call
//	Pin, Unpin        counted pins, optionally timed (leases); all or nothing
//	Store.Remove      idempotent; on L2 it is gone once its header is zeroed;
//	                  a pinned key is refused (FAILED_PRECONDITION), but
//	                  one only other hosts' reads pin (NewSessionForOthers) goes as
//	                  with RemoveHere; one another caller is reading (from
//	                  L2, or copying out) or removing at that moment is
//	                  BUSY: asked again, it goes (the store's own I/O on a
//	                  key is joined instead)
//	RemoveHere        a removal another host asked for: a pinned key goes
//	                  too, hidden from every reader at once and freed with
//	                  its last pin (hide.go); RemoveRecordsHere names the
//	                  record, so a value put again since stays
//	Store.Stat, List  the operator's view of a key, of keys by prefix
//	Store.Flush       wait until nothing is owed a writeback
//
// Calls that may wait for the device (durable puts, promotions, removals
// from L2) take a Completion: they return pending=true and call
// Completion.StoreDone once every result is final, so a queue worker never
// blocks on the device; with a nil Completion they block instead. A key
// that finds every L2 I/O task busy (the store's own writeback may hold
// three quarters of them) waits for the next free one, first come first
// served, in the same way: the store's own work never answers BUSY
// (wait.go).
//
// # Tiers
//
// L1 is bounded by Config.L1Capacity; over HighWatermark the maintenance
// loop evicts least recently used, unpinned values down to LowWatermark, and
// an allocation that finds no room evicts clean values itself. A pinned
// value, or one with I/O in flight, is never evicted or moved. Without
// durable, a value is written back to L2 in the background; a writeback that
// fails is retried WritebackRetries times after WritebackBackoff and then
// becomes a tombstone (counted, logged, never retried; the value stays in
// L1 until evicted). A Get of an L2-only value reserves a pool block, reads
// the value into it and checks its crc32c. L2 itself evicts by LRU over its
// own watermarks, and empties a whole region when a slot size has none.
//
// # Crash safety
//
// L2 is self-describing (format in l2format.go): a block's header (key,
// length, crc32c, sequence number, nonces, its own offset) is written after
// its value, and a slot is reused only after its old header is zeroed, so
// every header that decodes describes a whole value. New rebuilds the index
// and the allocation map by reading the headers (and, with VerifyOnOpen,
// every value); damaged headers are dropped and counted. "Durable" means on
// the device as far as the kernel is concerned: it survives the daemon's
// death; surviving power loss also needs a device without a volatile write
// cache (the transport issues no flushes yet). A value removed from
// another host while pinned is hidden only once its header is zeroed and
// its L1 journal record dropped, so a restart while the pin lasts does
// not find it again.
//
// # In the daemon
//
// tensorcastd opens one store at start-up (daemon/store.go: L1 in its
// pool, L2 data_dir/store.l2 through the file tier's io_uring transport by
// default, the store_* config keys) and closes it in the drain after the
// control server. Each client connection has one Session (session/store.go),
// closed with the connection. The socket carries the copying calls and the
// operator's (wire/store.go); a queue carries Get, Reserve, Commit, Exists,
// LookupPrefix and Unpin with their keys in its shared memory
// (session/queue_store.go; the encoding is package queue's), and a call
// that waits for the device ends through its Completion.
//
// # Concurrency
//
// The index is sharded (Config.Shards), each shard with its own lock,
// open-addressing hash table, entries, key arena and LRU lists, all
// pointer-free; a call locks one shard per key, never the whole store, and
// the hot calls allocate nothing. Lock order: Session.mu, a shard's mu, then
// the leaves (the L2 allocator, the task table, leases, retries, the pool).
// The store owns one goroutine, the maintenance loop, which also hands
// freed L2 tasks to the keys waiting for one; Close stops it after the
// calls in progress have finished, ends the keys still waiting with
// ErrClosed, then waits (bounded) for L2 I/O.
package store
