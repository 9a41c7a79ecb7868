package wire

import "github.com/tensorcast/tensorcast/fbs/tcproto"

// Bounds of a DirectoryResponse beyond the decode limits: a member's
// capabilities and the store's endpoints.
const (
	MaxDirectoryCaps      = 16
	MaxDirectoryEndpoints = 64
)

// AgeNever is the age, in a DirectoryResponse, of what the store never
// confirmed.
const AgeNever = ^uint64(0)

// DirectoryRequest asks for the peer directory (tcctl directory).
type DirectoryRequest struct{ noFields }

func (*DirectoryRequest) Kind() RequestKind { return tcproto.RequestBodyDirectoryRequest }

// DirectoryResponse is the peer directory: its backend ("embedded" or
// "etcd") and state, the store it reads, its cache's counters and the
// members it knows. Its strings are copies: the answer outlives its frame.
type DirectoryResponse struct {
	Backend string
	// State is static (embedded), connecting, up, down, conflict or
	// closed, since SinceUnixMS; Outages counts the times the store went
	// down.
	State       string
	SinceUnixMS uint64
	Outages     uint64
	Endpoints   []string // at most MaxDirectoryEndpoints
	Prefix      string
	BudgetMS    uint64 // the staleness budget
	LeaseTTLMS  uint64
	Self        string
	Epoch       uint64
	Cache       DirectoryCache
	// Members are as many as fit a frame; MembersTotal is how many the
	// directory knows.
	Members      []DirectoryMember
	MembersTotal uint32
	// Published counts this daemon's exports in the catalog, Pending
	// those not written yet (the store is down).
	Published, Pending uint32
}

func (*DirectoryResponse) Kind() ResponseKind { return tcproto.ResponseBodyDirectoryResponse }

func (m *DirectoryResponse) fields(f *fields) {
	text(f, 0, &m.Backend, f.lim.MaxString)
	text(f, 1, &m.State, f.lim.MaxString)
	scalar(f, 2, &m.SinceUnixMS)
	scalar(f, 3, &m.Outages)
	texts(f, 4, &m.Endpoints, MaxDirectoryEndpoints, f.lim.MaxString)
	optText(f, 5, &m.Prefix, f.lim.MaxString)
	scalar(f, 6, &m.BudgetMS)
	scalar(f, 7, &m.LeaseTTLMS)
	text(f, 8, &m.Self, f.lim.MaxString)
	scalar(f, 9, &m.Epoch)
	nested(f, 10, &m.Cache)
	optTables(f, 11, &m.Members, f.lim.MaxItems)
	scalar(f, 12, &m.MembersTotal)
	scalar(f, 13, &m.Published)
	scalar(f, 14, &m.Pending)
}

// DirectoryCache is the directory cache's counters (the schema's
// DirectoryCache). A hit was answered from the cache within the staleness
// budget; a fallback went past it, to the store or to the owning peer;
// Unavailable lookups failed closed.
type DirectoryCache struct {
	Lookups, Hits, NotFound     uint64
	FallbackStore, FallbackPeer uint64
	Unavailable, Corrections    uint64
	StoreReads, Dropped         uint64
	AgeMS                       uint64 // since the store last proved the cache current
	Synced                      bool   // false: never
	Revision                    uint64
	Members, Exports            uint32
	StoreRequests               uint64 // requests sent to the store, keep-alives included
}

func (m *DirectoryCache) fields(f *fields) {
	scalar(f, 0, &m.Lookups)
	scalar(f, 1, &m.Hits)
	scalar(f, 2, &m.NotFound)
	scalar(f, 3, &m.FallbackStore)
	scalar(f, 4, &m.FallbackPeer)
	scalar(f, 5, &m.Unavailable)
	scalar(f, 6, &m.Corrections)
	scalar(f, 7, &m.StoreReads)
	scalar(f, 8, &m.Dropped)
	scalar(f, 9, &m.AgeMS)
	flag(f, 10, &m.Synced)
	scalar(f, 11, &m.Revision)
	scalar(f, 12, &m.Members)
	scalar(f, 13, &m.Exports)
	scalar(f, 14, &m.StoreRequests)
}

// DirectoryMember is one member as the directory knows it (the schema's
// DirectoryMember).
type DirectoryMember struct {
	ID    string
	Epoch uint64
	Addr  string   // empty while not known
	Caps  []string // at most MaxDirectoryCaps
	Self  bool
	// AgeMS is how old the cache's entry is (0 for the embedded
	// directory's, AgeNever for one the store never confirmed);
	// LeaseLeftMS the registration's lease time left, when LeaseKnown.
	AgeMS       uint64
	LeaseLeftMS uint64
	LeaseKnown  bool
}

func (m *DirectoryMember) fields(f *fields) {
	text(f, 0, &m.ID, f.lim.MaxString)
	scalar(f, 1, &m.Epoch)
	optText(f, 2, &m.Addr, f.lim.MaxString)
	texts(f, 3, &m.Caps, MaxDirectoryCaps, f.lim.MaxString)
	flag(f, 4, &m.Self)
	scalar(f, 5, &m.AgeMS)
	scalar(f, 6, &m.LeaseLeftMS)
	flag(f, 7, &m.LeaseKnown)
}
