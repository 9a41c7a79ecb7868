// Package cluster is tensorcast's store across hosts: one KV store over
// the daemons of a cluster, so that a key put on one host is found and
// read, with the same store calls, on every other.
//
// Roles (each a job of every daemon for part of the key space):
//   - Home. Keys hash to Config.Shards shards (FNV-1a of the key); each
//     shard's home is chosen by rendezvous hashing over the members (this
//     daemon and its configured peers), so a change of members moves only
//     the shards that must move. The home keeps the shard's location index
//     in memory (index.go): key → holders (daemon id and epoch, tier,
//     size, crc32c), bounded by Config.MaxKeys and Config.MaxHolders. A
//     home refuses what it is asked about a shard it is not home of under
//     its own view of the members (ErrNotHome), so a sender with another
//     view learns and never gets an answer for a shard it asked the wrong
//     daemon about. A lone daemon is home of every shard.
//   - Holder. The daemon whose store has the bytes. The store tells the
//     Cluster of every value that becomes visible (store.Remote.Stored);
//     the announcer goroutine sends them to their homes, one exchange per
//     home per batch, never one per key. A reader's hold exchange pins the
//     keys it reads in a store session of their own (a claim), released
//     by the reader when its read ends, or by the hold's deadline when the
//     reader is gone: nothing stays pinned after a reader dies.
//   - Reader. A daemon whose client missed a key here (store.Remote.Fetch):
//     it asks the keys' homes, batched per home and in parallel, takes a
//     claim on a holder, reserves blocks of its own pool, reads the bytes
//     straight into them over the peer link (Mover: rdma where the link is
//     up, else tcp), checks the crc32c the home gave (tcp takes it as the
//     bytes come off the socket, while they are in cache: Span.Sum;
//     rdma's bytes land by DMA and are read again), commits them as a
//     copy of its own (announced in turn: a hot key ends up near its
//     readers) and answers like a local get. That copy answers the get
//     that fetched it and no other reader until the key's home has taken
//     its announcement (store.CommitFetched, then store.Confirm): a
//     removal the home took before cannot name it, and it is answered
//     "removed" and dropped instead of served meanwhile. A read that fails, or whose
//     bytes do not match, tries the next holder; a key no holder gives is
//     a miss, and every fetch ends by Config.Timeout. A read that failed
//     with its transfer still under way (an rdma READ past its deadline
//     cannot be called back) answers at once, but the blocks it was
//     reading into go back to the pool only once the Mover says nothing
//     can land in them any more (Mover.Read's settled; Stats.Unsettled):
//     a late transfer never writes into another value. The home hands a
//     claim with each location it answers (claim.go): a bounded number of
//     readers per holder and key, released when the read ends or at its
//     deadline, so a hot key spreads over its replicas; a key whose every
//     replica is at its limit is answered busy and asked again. A holder
//     admits as many readers of a key at once, whoever sent them (a
//     reader of a cached home answer asks no home): past that it answers
//     busy, so the bound holds for cached reads too. A get of a key whose
//     holders the reader has cached, over tcp (or over a link whose bulk
//     bytes go by rdma, for the one value of a get no larger than the
//     daemon's rdma_inline_read), is one round trip (quick.go):
//     the holder admits the reader, sends the value in its answer straight
//     into the reader's pool blocks and is done with it when the send is;
//     no hold, release or claim message, and the announcement of the
//     reader's copy goes after the answer. A get of many keys whose cached
//     values come to at most 4 MiB reads them all so, at once (the others
//     take the two-step way at the same time); a larger one takes the
//     two-step way whole.
//   - Replicas (replica.go). A value put here is copied to Config.Replicas-1
//     other daemons picked by rendezvous over the key (each reads it from
//     this one's pool and announces its copy to the home); a durable put
//     answers once every copy is on its holder's L2.
//   - Modes. Config.Admission (the daemon's mode) admits each remote get
//     and each read served to another daemon: budgets, never correctness.
//
// Members (members.go). A member is up once it speaks or answers (a
// handler ran for it, or the prober's hello every Config.ProbeEvery got
// through) and down once an exchange with it finds it unreachable or
// silent for a good part of Config.Timeout. A failed exchange sent before
// the member last came up, or before one it answered was sent, says
// nothing of it now (an exchange sent into a cut that times out after it
// healed) and leaves it up. A member that answers busy (tcp's bound on
// exchange handlers running at once, all taken: a daemon back from a
// restart that its members all tell at once) is there and ran nothing of
// the exchange: a hello it answers busy leaves it in, and any other
// exchange is sent again after a short back-off, a few times within about
// 60 ms, then fails as any other failure does (taking the member out
// would make another daemon stand in as home of its shards, which
// removals sent to it never reach). The handlers that wait on exchanges
// of their own (a removal on its drops, a replica on its read and
// announcement: nestedKinds) run under a bound apart from the handlers
// they wait on (Peers.HandleNested), so two daemons full of removals
// waiting on each other still answer each other's drops. When a member taken for down is heard from
// again, this daemon's connections to it whose bytes are unacknowledged
// and retransmitted on a backed-off timer are closed (StallDropper): a
// cut leaves them open, and once it heals their bytes would wait seconds
// for TCP's next retransmission, while a new connection goes at once.
//
// Fencing (fence.go). Every message to a home carries the generation of
// each of its keys' shards it was sent for; a home that does not hold
// that generation refuses it and obeys none of it, and the sender
// refreshes and resends once. With directory = etcd a generation is a
// claim the home took in etcd under its member lease (a transaction that
// succeeds only for the generation expected), and homes follow the
// claims; without etcd it is the home's run epoch. A claim whose holder is
// out of a daemon's view but still listed by etcd (a partition) is taken
// only by a daemon that sees a majority of etcd's members, and never back
// from the member that took it, so claims do not change hands every round
// while a partition lasts. A daemon that sees no majority holds only the
// shards etcd's list makes its own, and releases those it took from
// others on its way there (a partition reaches the members one at a
// time), for the majority's side to take.
//
// Removal (tomb.go). A removal drops the key at its home and every copy
// at its holders; a holder the home does not reach is remembered with its
// copy (a tombstone, bounded in number and age), asked again when it is
// back, and answered "removed" when it re-announces that copy; a holder
// still a member that did not answer the drop (busy, or slow) is asked
// again within the removal's time (half of Config.Timeout, pausing 50 ms
// and more between tries: dropSoon), and the removal is answered OK only
// once every member holding a copy dropped it; one that still has not
// makes the remove answer UNAVAILABLE (ErrCopyKept: a reader with a
// cached home answer may be served that copy), and it is asked again
// after a pause growing to 2 s until it drops the copy, one round per
// holder at a time (retryDrops). The same remove sent again asks it too
// (a member's tombstone counts as a holder), so a retried remove answers
// OK only once the copy is gone. The
// tombstones move with their shard to its new home (handTombs: one
// hand-off per home at a time, stopped at the first message not taken,
// so a home just back is not sent its shards' tombstones again and again
// while it is least able to take them), so a
// removed key does not come back when its home changed meanwhile; and
// the home gives a copy of each to the two members next in the shard's
// rendezvous order before it answers (keepTombs), which hand them to
// whoever is home later and ask the holder to drop the copy when it is
// back, so the removal holds when its home dies too. A home that gained a
// shard rebuilds its index of it from the members' re-announcements,
// which it asks for (a pull, numbered; a run pulls every member once its
// start-up greeting ends, and members do not also send their copies on
// their own when they see a restart, which walked each store twice):
// until a member has said that a walk of its store begun after the
// home's pull announced it every copy it holds of the shard, and its
// home did not change while the walk ran (walk.go;
// a member of an older release, which cannot say so, for
// Config.TombstoneTTL after the gain), the home asks that member to drop
// each key of the shard it removes, not only the holders its index names,
// and tombstones such members away, so that a copy re-announced after
// the removal is not indexed and served again. A daemon that is a
// key's home only because the key's own home is away (its view lacks
// members) knows only the copies announced to it since: removing the key
// it also tombstones each member away, with the value's size and crc32c
// when it knows a copy, else for whatever value of the key the member has
// then (tombAway), so a copy there goes when the member is back instead
// of being served again. Every drop a tombstone sends says how long ago
// its removal was, and a holder keeps a value it put after that (it notes
// the time of its puts while members are away and for a while after:
// apart.go), so a removal told late never takes a newer put; and once such
// a tombstone is handed on or spent,
// the daemon tells the key's home it holds no copy either unless it does
// (goneHere), since that home's index, stale from before, may name it. A
// copy a client or
// a reader's hold pins on its holder goes all the same: the holder's
// store hides it from every reader at once, its own clients included
// (store.RemoveHere: no get, exists, lookup_prefix or pin finds it, it is
// never served nor re-announced), keeps its block for the pins, which
// read the exact bytes they pinned, and frees it with the last, however
// long that takes; a put of the key meanwhile is a new value. A copy with
// a caller's I/O in flight (a copy out, a promotion) goes once that ends,
// hidden from the other daemons meanwhile (dropLater); the retry names
// the record removed, so a value put again since stays.
//
// A removal and the announcements racing it end the same whatever their
// order. A home checks an announced copy against its removals (the
// tombstones, and for a reader's fetched copy the keys removed in the last
// two timeouts) and indexes it in one step under the shard's lock, the
// same lock under which a removal marks the key and drops its holders: a
// copy is either dropped by the removal or answered "removed", never
// indexed between the two. A holder's store tells the holder's announcer
// of every record removed there, in the order of its puts (under the
// store's shard lock), and the announcer sends only each key's last state
// of a batch: a put's announcement still queued when the put was removed
// does not index a copy that is gone. A re-announcement walk, which reads
// what is held and sends it later, has the store queue again the state of
// each key whose record changed meanwhile (store.Recheck), after the
// walk's own announcement has been answered. A fetch keeps no copy while the
// announcements waiting are at Config.MaxPending (BUSY): every fetched
// copy is announced. And a fetched copy is unseen by readers on its
// holder (store's unseen.go) until its home has indexed it: before that,
// a removal at the home could not drop it, and however late its
// announcement arrives (a slow or flooded home), it is never served as a
// removed key; a copy whose announcement fails or is refused is dropped.
//
// Messages are exchanges on the peer channel (tcp.Node.Exchange, kinds
// "tc.store.*"), addressed to the epoch the sender knows, so a daemon that
// restarted never obeys what was meant for its previous run. Their codec
// is msg.go, fuzzed. A message that gains a part an older release would
// refuse is a kind of its own (the announcement answered with removals'
// ages, the tombstone's drop with them): a member that serves the older
// kind but not the newer is logged once per run and sent the older kind
// (for a minute at a time, counted), so daemons of two releases keep one
// store through a rolling upgrade and neither is sent what it refuses; a
// removal such a member missed takes whatever copy it has, as that
// release did.
//
// Pushed answers (push.go). A home pushes its fresh answer for a key whose
// holders changed to the readers that asked it about the key's shard
// lately (one message per reader per Config.Staleness/4), so that their
// next read of the shard's keys finds the answer cached; a reader takes
// a push only from the home of the key it knows, at its generation.
//
// Goroutines and stop order: a Cluster owns the announcer and one
// goroutine per fetch in flight (at most Config.MaxFetches) and per hold's
// expiry timer, the reannouncer (and prober), the replicator and the
// pusher. Close stops the pusher first, then the other three, ends the copies still queued with ErrClosed, waits for
// the fetches (each ends by its deadline), releases every hold and closes
// the claims table. The daemon closes it
// before the store and the peer plane.
package cluster
