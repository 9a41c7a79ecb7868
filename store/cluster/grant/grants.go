package grant

import "github.com/tensorcast/tensorcast/directory"

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
// record) told; one without a known epoch is not known for certain.
type DirectoryMembers struct{ Dir directory.Directory }

var _ Members = DirectoryMembers{}

// Epoch implements Members.
func (m DirectoryMembers) Epoch(id string) (uint64, bool) {
	p, ok := m.Dir.Lookup(id)
	if !ok || p.Epoch == 0 {
		return 0, false
	}
	return p.Epoch, true
}
