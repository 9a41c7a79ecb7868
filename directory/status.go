package directory

import (
	"context"
	"time"
)

// Backend states as Status reports them.
const (
	// StateStatic: the embedded directory (config only); nothing to reach.
	StateStatic = "static"
	// StateUp: the store answers and the feed is current.
	StateUp = "up"
	// StateDown: the store has not answered for longer than the budget;
	// lookups past the budget fail closed until it does.
	StateDown = "down"
	// StateConflict: another live daemon holds this daemon's id; this one
	// is not registered.
	StateConflict = "conflict"
	// StateClosed: the directory is closed.
	StateClosed = "closed"
)

// MemberStatus is one member as `tcctl directory` shows it.
type MemberStatus struct {
	ID    string
	Epoch uint64
	Addr  string
	Caps  []string
	Self  bool
	// Age is how old the cache's entry is.
	Age time.Duration
	// LeaseLeft is the time its registration has left before it lapses
	// (-1: not known; the store did not say).
	LeaseLeft time.Duration
}

// Status is the directory as `tcctl directory` shows it.
type Status struct {
	// Backend is "embedded" or "etcd"; State one of the State constants.
	Backend string
	State   string
	// Since is when State began; Outages counts the times the store
	// went down.
	Since   time.Time
	Outages uint64
	// Endpoints and Prefix say which store and where in it.
	Endpoints []string
	Prefix    string
	// Budget is the staleness budget, LeaseTTL the registration's lease.
	Budget   time.Duration
	LeaseTTL time.Duration
	// Self is this daemon's id and epoch.
	Self  string
	Epoch uint64
	// Cache is the cache's counters and age.
	Cache   CacheStats
	Members []MemberStatus
	// Published counts this daemon's exports in the catalog, Pending the
	// ones not yet written (the store is down).
	Published, Pending int
	// Requests counts the requests sent to the store (keep-alives and
	// progress requests included).
	Requests uint64
}

// Reporter reports the directory for `tcctl directory`. Status may read
// the store (lease times) within ctx; it is not on any hot path.
type Reporter interface {
	Status(ctx context.Context) Status
}

// Status implements Reporter for the embedded directory: the configured
// peers, each as old as the daemon's config (age 0), no leases.
func (d *Embedded) Status(context.Context) Status {
	s := Status{Backend: "embedded", State: StateStatic, Self: d.self, Cache: CacheStats{}}
	for _, p := range d.List() {
		if p.Self {
			s.Epoch = p.Epoch
		}
		s.Members = append(s.Members, MemberStatus{ID: p.ID, Epoch: p.Epoch, Addr: p.Addr, Self: p.Self, LeaseLeft: -1})
	}
	return s
}
