package grant

import (
	"context"
	"time"

	"github.com/tensorcast/tensorcast/directory"
)

// Grants are what one store's clients are granted: its retention handles
// (this daemon their issuer) and its placement leases. The daemon makes
// one per store (per tenant), so one tenant's handles and leases never pin
// another's keys, and closes it before the store.
type Grants struct {
	Handles *Handles
	Leases  *Leases
	// Pins bounds the bytes the handles and leases pin in all (nil: no
	// bound but each one's store session's).
	Pins *PinBudget
}

// Close releases every handle's and lease's pins.
func (g *Grants) Close() {
	g.Handles.Close()
	g.Leases.Close()
}

// DirectoryMembers is the membership of a peer directory as Members: a
// daemon is known by the epoch its last handshake (or its directory
// record) told; one without a known epoch is not known for certain. A
// directory that answers within a staleness budget (etcd's: it implements
// memberResolver) is asked as a catalog-first request is: past the budget
// it reads the store within resolveWait, and a member it cannot confirm is
// not known for certain, so a token of it is refused (fail closed).
type DirectoryMembers struct{ Dir directory.Directory }

var _ Members = DirectoryMembers{}

// memberResolver is a directory whose answers have an age (etcd's).
type memberResolver interface {
	ResolveMember(ctx context.Context, lane directory.Lane, id string) (directory.MemberView, error)
}

// resolveWait bounds the store read of a member whose cached entry is
// older than the directory's staleness budget.
const resolveWait = 2 * time.Second

// Epoch implements Members.
func (m DirectoryMembers) Epoch(id string) (uint64, bool) {
	if r, ok := m.Dir.(memberResolver); ok {
		ctx, cancel := context.WithTimeout(context.Background(), resolveWait)
		defer cancel()
		v, err := r.ResolveMember(ctx, directory.LaneCatalogFirst, id)
		if err != nil || v.Member.Epoch == 0 {
			return 0, false
		}
		return v.Member.Epoch, true
	}
	p, ok := m.Dir.Lookup(id)
	if !ok || p.Epoch == 0 {
		return 0, false
	}
	return p.Epoch, true
}
