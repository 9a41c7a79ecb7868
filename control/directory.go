package control

import (
	"context"
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/wire"
)

// directoryTimeout bounds one directory report: the etcd directory reads
// its members' lease times from the store within it.
const directoryTimeout = 3 * time.Second

// directoryReport answers tcctl directory from Deps.Directory: the backend
// and its state, the cache's counters and as many members as fit a frame
// (MembersTotal says how many there are).
func (c *conn) directoryReport() error {
	rep := c.s.deps.Directory
	if rep == nil {
		return fmt.Errorf("%w: this daemon has no directory to report", ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(context.Background(), directoryTimeout)
	defer cancel()
	*wire.SetResponse[wire.DirectoryResponse](&c.resp) = directoryResponse(rep.Status(ctx), c.s.cfg.MaxFrame)
	return nil
}

// directoryResponse is st on the wire, its members cut to what fits
// maxFrame bytes.
func directoryResponse(st directory.Status, maxFrame int) wire.DirectoryResponse {
	cs := st.Cache
	r := wire.DirectoryResponse{
		Backend: st.Backend, State: st.State, Outages: st.Outages,
		Endpoints: st.Endpoints[:min(len(st.Endpoints), wire.MaxDirectoryEndpoints)], Prefix: st.Prefix,
		BudgetMS: ms(st.Budget), LeaseTTLMS: ms(st.LeaseTTL), Self: st.Self, Epoch: st.Epoch,
		Cache: wire.DirectoryCache{Lookups: cs.Lookups, Hits: cs.Hits, NotFound: cs.NotFound,
			FallbackStore: cs.FallbackStore, FallbackPeer: cs.FallbackPeer, Unavailable: cs.Unavailable,
			Corrections: cs.Corrections, StoreReads: cs.StoreReads, Dropped: cs.Dropped,
			AgeMS: ageMS(cs.Age), Synced: cs.Age != directory.Never, Revision: uint64(max(cs.Rev, 0)),
			Members: uint32(cs.Members), Exports: uint32(cs.Exports), StoreRequests: st.Requests},
		MembersTotal: uint32(len(st.Members)), Published: uint32(st.Published), Pending: uint32(st.Pending),
	}
	if !st.Since.IsZero() {
		r.SinceUnixMS = uint64(max(st.Since.UnixMilli(), 0))
	}
	// What a member takes on the wire, generously: its strings and a
	// table's overhead; the rest of the answer is well under 4 KiB.
	room := maxFrame - 4096
	for _, e := range r.Endpoints {
		room -= len(e) + 8
	}
	for _, m := range st.Members {
		size := 96 + len(m.ID) + len(m.Addr)
		for _, c := range m.Caps {
			size += len(c) + 8
		}
		if room -= size; room < 0 {
			break
		}
		wm := wire.DirectoryMember{ID: m.ID, Epoch: m.Epoch, Addr: m.Addr, Caps: m.Caps[:min(len(m.Caps), wire.MaxDirectoryCaps)],
			Self: m.Self, AgeMS: ageMS(m.Age)}
		if m.LeaseLeft >= 0 {
			wm.LeaseLeftMS, wm.LeaseKnown = ms(m.LeaseLeft), true
		}
		r.Members = append(r.Members, wm)
	}
	return r
}

func ms(d time.Duration) uint64 { return uint64(max(d, 0) / time.Millisecond) }

func ageMS(d time.Duration) uint64 {
	if d == directory.Never {
		return wire.AgeNever
	}
	return ms(d)
}
