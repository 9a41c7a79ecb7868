package directory

import "fmt"

// Lane is a request's lane, from its control context. The lane chooses the
// directory's posture when a cache entry is older than the staleness
// budget; it never changes what is correct (the peer's fencing decides
// that), only where a lookup may go to be answered.
type Lane uint8

const (
	// LaneCatalogFirst (also a request without a lane): long-lived,
	// widely shared objects. A lookup past the budget refreshes from the
	// store, and fails UNAVAILABLE when the store does not answer.
	LaneCatalogFirst Lane = iota
	// LaneStreamFirst: short-lived, high-rate objects. A lookup never
	// waits on the store: past the budget it goes to the owning peer at
	// the address the cache last knew, whose handshake and token checks
	// are the answer; with nothing cached it fails UNAVAILABLE.
	LaneStreamFirst
	// LaneHybridCacheFirst: shared hot objects. Past the budget it asks the
	// peer when the cache knows one, else the store.
	LaneHybridCacheFirst
)

// Lane names as requests carry them.
const (
	NameCatalogFirst     = "catalog-first"
	NameStreamFirst      = "stream-first"
	NameHybridCacheFirst = "hybrid-cache-first"
)

func (l Lane) String() string {
	switch l {
	case LaneCatalogFirst:
		return NameCatalogFirst
	case LaneStreamFirst:
		return NameStreamFirst
	case LaneHybridCacheFirst:
		return NameHybridCacheFirst
	}
	return fmt.Sprintf("lane(%d)", uint8(l))
}

// ParseLane reads a request's lane; empty is catalog-first. Any other
// name is refused (ErrInvalid): the vocabulary is closed, and a lane the
// daemon does not know would choose a posture by guess.
func ParseLane(s string) (Lane, error) {
	switch s {
	case "", NameCatalogFirst:
		return LaneCatalogFirst, nil
	case NameStreamFirst:
		return LaneStreamFirst, nil
	case NameHybridCacheFirst:
		return LaneHybridCacheFirst, nil
	}
	return 0, fmt.Errorf("%w: lane %q (want %s, %s or %s)", ErrInvalid, s, NameCatalogFirst, NameStreamFirst, NameHybridCacheFirst)
}

// Source says where a lookup's answer came from.
type Source uint8

const (
	// SourceCache: the cache, within the staleness budget (a hit).
	SourceCache Source = iota + 1
	// SourceStore: the cache was past its budget; the entry was read again
	// from the store (a fallback).
	SourceStore
	// SourcePeer: the cache was past its budget and the lane does not wait
	// on the store: the answer is the cache's last word, to be confirmed by
	// the owning peer itself (a fallback). The caller must go to the peer
	// and report what it found (Observe, Unreachable, ExportGone).
	SourcePeer
)

func (s Source) String() string {
	switch s {
	case SourceCache:
		return "cache"
	case SourceStore:
		return "store"
	case SourcePeer:
		return "peer"
	}
	return "none"
}
