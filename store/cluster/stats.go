package cluster

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Stats are the cluster's figures, for the metrics endpoint and `tcctl
// stats`.
type Stats struct {
	Members   int // members up, this daemon included
	HomeOf    int // shards this daemon is home of
	IndexKeys int // keys in this daemon's location index
	Holds     int // claims readers hold here now
	// Unsettled are failed reads here whose blocks stay reserved until
	// their late transfers end (an rdma READ that outlived its deadline).
	Unsettled   int
	ViewChanges uint64

	Announced, AnnounceSent, AnnounceDropped, AnnounceFailed uint64
	Reannounced                                              uint64

	Lookups, LookupsLocal, LookupFailed uint64 // keys asked of other homes, answered here, failed
	CacheHits                           uint64 // keys answered from the cache of home answers

	RemoteHits, RemoteMisses, RemoteFailed, RemoteBytes uint64
	CRCMismatch                                         uint64
	// CRCLanded counts the values read from holders whose crc32c the
	// transport took as their bytes landed (tcp), so the reader did not
	// read them again; the others' it took from the pool.
	CRCLanded                         uint64
	HoldsGiven, HoldsRefused, Removes uint64

	// Tombstones are the removed copies this daemon (a home) remembers for
	// holders it did not reach; TombHits the re-announced copies it
	// answered "removed", TombDrops the copies this daemon (a holder)
	// dropped on such an answer; TombExpired and TombEvicted those that
	// went by age and by the bound.
	Tombstones                                    int
	TombHits, TombDrops, TombExpired, TombEvicted uint64
	// TombRetried counts the copies a holder dropped when asked again
	// (back after being away, or a member a removal's drop did not
	// reach); DropRetryRounds the rounds of such drops asked again of a
	// member after one failed. TombsHanded counts the tombstones this
	// daemon handed to the new home of their shard, HandStopped the
	// hand-offs stopped at a message the home did not take (handed with
	// the next probe), TombsTaken those it took from a previous home.
	TombRetried, DropRetryRounds, TombsHanded, HandStopped, TombsTaken uint64
	// DropsSoon counts the copies a member dropped when asked again within
	// the removal's own time (busy or slow at first); RemovesKept the keys
	// whose removal answered that a member's copy stayed past that time
	// (ErrCopyKept: asked again in rounds).
	DropsSoon, RemovesKept uint64
	// TombsKept are the copies of other homes' tombstones this daemon
	// keeps in case their home dies (tomb.go); KeepsGiven the copies of
	// its own it gave keepers, KeepsFailed those a keeper did not take,
	// KeepsNone its tombstones made with no member to keep a copy (the
	// other members away, or none).
	TombsKept                          int
	KeepsGiven, KeepsFailed, KeepsNone uint64
	// PutsApart are the puts this daemon notes the time of, made while
	// members were away or lately (apart.go); PutsApartOver counts the
	// notes pushed out by the bound (a removal told late takes those
	// values), PutsKept the values put after a removal that a late drop
	// of the key left here.
	PutsApart               int
	PutsApartOver, PutsKept uint64
	// LateLosses counts the failed exchanges with a member up again that
	// were sent before it answered again (or came up): not taken for the
	// member going down (members.go, lost).
	LateLosses uint64
	// BusyRetries counts the exchanges sent again after their peer
	// answered busy (cluster.go, exchangeBy); BusyHellos the hellos a
	// member answered busy, which leave it in (members.go, hello).
	BusyRetries, BusyHellos uint64
	// OlderKinds counts the messages sent as the kind an older release
	// knows, to a member that serves none with removal ages (members.go,
	// older).
	OlderKinds uint64
	// Rebuilding are the shards this daemon is home of whose index may
	// still lack copies: a member up has not said its re-announcement
	// since the shard was gained is done (walk.go). WalksTaken counts the
	// members' word of such walks; RemoveAsksUnnamed the drops a removal
	// asked of members its index did not name, for those shards.
	Rebuilding                    int
	WalksTaken, RemoveAsksUnnamed uint64
	// GonePinned are the removed keys still here because a caller's I/O
	// was in flight on them (hidden from the other daemons, dropped once
	// it ends; a pinned one is hidden by the store at once, counted in
	// store.Stats.Hidden); GoneOver those past Config.MaxTombstones,
	// which stay.
	GonePinned int
	GoneOver   uint64
	// StaleRefused counts messages this daemon (a home) refused for a
	// generation it does not hold; StaleAnswers the refusals it got as a
	// sender; ClaimsWon the shards it claimed (with etcd).
	StaleRefused, StaleAnswers, ClaimsWon uint64
	// Claims this daemon, as a home, handed readers: outstanding now,
	// ever granted, refused (every replica of the key at its limit) and
	// ended by their deadline unreleased.
	ClaimsOutstanding, ClaimsGranted, ClaimsRefused, ClaimsExpired uint64
	// ClaimsForeign counts releases this daemon (a home) refused: the
	// claim was another reader's. ReadersRefused counts keys this daemon
	// (a holder) answered Busy in a hold: at its reader limit.
	ClaimsForeign, ReadersRefused uint64
	// OverBudget counts remote gets and serves the mode's budget refused.
	OverBudget uint64
	// One-round-trip reads (quick.go): remote gets this daemon made with
	// one (QuickReads), those it began that went the two-step way
	// (QuickFallbacks), and those it served as a holder (QuickServed).
	QuickReads, QuickFallbacks, QuickServed uint64
	// Copies of values put here made on other daemons, copies that
	// failed, and puts that asked for more copies than daemons were up.
	ReplicasMade, ReplicaFailures, ReplicasShort uint64

	// ByPeer are the remote gets this daemon made, by holder.
	ByPeer map[string]PeerStats
}

// PeerStats are the remote gets from one holder.
type PeerStats struct {
	Gets, Bytes uint64
}

// peerCounts counts remote gets by holder.
type peerCounts struct {
	// mu guards m.
	mu sync.Mutex
	m  map[string]PeerStats
}

func (p *peerCounts) add(id string, bytes uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]PeerStats{}
	}
	s := p.m[id]
	s.Gets++
	s.Bytes += bytes
	p.m[id] = s
}

// Stats reports the cluster's figures.
func (c *Cluster) Stats() Stats {
	v := c.view.Load()
	c.byPeer.mu.Lock()
	by := maps.Clone(c.byPeer.m)
	c.byPeer.mu.Unlock()
	cs := c.claims.Stats()
	own, kept := c.tombs.count()
	return Stats{
		Members: len(v.members), HomeOf: c.homeOf(v), IndexKeys: int(c.idx.keys.Load()), Holds: c.Holds(),
		Unsettled:   int(c.c.unsettled.Load()),
		ViewChanges: c.c.viewChanges.Load(),
		Announced:   c.c.announced.Load(), AnnounceSent: c.c.announceSent.Load(),
		AnnounceDropped: c.c.announceDropped.Load(), AnnounceFailed: c.c.announceFailed.Load(),
		Reannounced: c.c.reannounced.Load(),
		Lookups:     c.c.lookups.Load(), LookupsLocal: c.c.lookupsLocal.Load(), LookupFailed: c.c.lookupFailed.Load(),
		CacheHits:  c.c.cacheHits.Load(),
		RemoteHits: c.c.remoteHits.Load(), RemoteMisses: c.c.remoteMisses.Load(), RemoteFailed: c.c.remoteFailed.Load(),
		RemoteBytes: c.c.remoteBytes.Load(), CRCMismatch: c.c.crcMismatch.Load(), CRCLanded: c.c.crcLanded.Load(),
		HoldsGiven: c.c.holds.Load(), HoldsRefused: c.c.holdsRefused.Load(), Removes: c.c.removes.Load(),
		ByPeer:     by,
		Tombstones: own, TombsKept: kept, GonePinned: c.GonePinned(), GoneOver: c.c.goneOver.Load(), KeepsGiven: c.c.tombsKept.Load(), KeepsFailed: c.c.keepFailed.Load(), KeepsNone: c.c.keepNone.Load(), TombHits: c.tombs.hits.Load(), TombDrops: c.c.tombDrops.Load(),
		TombExpired: c.tombs.expired.Load(), TombEvicted: c.tombs.evicted.Load(), TombRetried: c.c.tombRetried.Load(),
		PutsApart: c.apart.len(), PutsApartOver: c.apart.over.Load(), PutsKept: c.c.putsKept.Load(), LateLosses: c.c.lateLosses.Load(),
		BusyRetries: c.c.busyRetries.Load(), BusyHellos: c.c.busyHellos.Load(), OlderKinds: c.c.olderKinds.Load(),
		Rebuilding: c.rebuildingShards(), WalksTaken: c.c.walksTaken.Load(), RemoveAsksUnnamed: c.c.removeAsksUnnamed.Load(),
		TombsHanded: c.c.tombsHanded.Load(), TombsTaken: c.c.tombsTaken.Load(),
		DropRetryRounds: c.c.dropRetryRounds.Load(), HandStopped: c.c.handStopped.Load(),
		DropsSoon: c.c.dropsSoon.Load(), RemovesKept: c.c.removesKept.Load(),
		StaleRefused: c.c.staleRefused.Load(), StaleAnswers: c.c.staleAnswers.Load(), ClaimsWon: c.c.claimsWon.Load(),
		ClaimsOutstanding: cs.Outstanding, ClaimsGranted: cs.Granted, ClaimsRefused: cs.Refused, ClaimsExpired: cs.Expired,
		ClaimsForeign: cs.Foreign, ReadersRefused: c.c.readersRefused.Load(),
		OverBudget: c.c.overBudget.Load(),
		QuickReads: c.c.quickReads.Load(), QuickFallbacks: c.c.quickFallbacks.Load(), QuickServed: c.c.quickServed.Load(),
		ReplicasMade: c.c.replicasMade.Load(), ReplicaFailures: c.c.replicaFailed.Load(), ReplicasShort: c.c.replicasShort.Load(),
	}
}

// routeCounters count how the homes of looked-up keys were found: by this
// daemon's view of the members and the shard claims (a cache: the
// directory's watch, the prober and the homes' answers keep it), and how
// often that view was wrong.
type routeCounters struct {
	// keys counts the keys of lookups sent to the home the view names
	// (this daemon's own index included), first sends only.
	keys atomic.Uint64
	// refused counts keys of lookups a home refused for a generation it
	// does not hold (sent again after a refresh); notHome keys this
	// daemon, as a home, answered "not home" (another view of the
	// members); unreachable keys whose named home did not answer.
	refused, notHome, unreachable atomic.Uint64
	// storeReads counts the shards whose claims a lookup's refusal had
	// this daemon read from etcd (Fence.Refresh), storeRequests the reads
	// (one request each, whatever its shards).
	storeReads, storeRequests atomic.Uint64
}
