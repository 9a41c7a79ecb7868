// Package directory is the peer directory: which daemons exist, where they
// listen and which epoch each one runs. The embedded backend holds this
// daemon plus the peers named in its config; a multi-host backend (etcd)
// implements the same interface. Lookups are served from memory and never
// touch the network: directory data is advisory and may be stale, the
// authority on a peer's epoch is the peer handshake.
package directory

import (
	"fmt"
	"sort"
	"sync"
)

// MaxIDLen bounds a daemon id, so ids fit in peer handshakes.
const MaxIDLen = 64

// Peer is one daemon as the directory knows it.
type Peer struct {
	ID   string
	Addr string // host:port of its peer listener
	// Epoch is the peer's current epoch once a handshake has told us; zero
	// while unknown.
	Epoch uint64
	// Self marks this daemon's own entry.
	Self bool
}

// Directory is what the transports use to find peers.
type Directory interface {
	// Lookup returns the peer with that id.
	Lookup(id string) (Peer, bool)
	// List returns every peer, this daemon included, sorted by id.
	List() []Peer
	// Update adds a peer or replaces its address and epoch. An empty Addr
	// keeps the known address; a zero Epoch keeps the known epoch.
	Update(p Peer) error
	// Remove forgets a peer.
	Remove(id string) error
}

// Embedded is the in-memory directory of a single daemon.
type Embedded struct {
	self string
	// mu guards peers.
	mu    sync.RWMutex
	peers map[string]Peer
}

var _ Directory = (*Embedded)(nil)

func validID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return fmt.Errorf("%w: id %q must be 1..%d bytes", ErrInvalid, id, MaxIDLen)
	}
	return nil
}

// NewEmbedded returns a directory holding self and the configured peers.
// A peer may be listed without an address: it is known (its daemon may
// dial in) but cannot be dialed until an Update gives it one (the peer
// plane does, from the address the peer advertises when it dials in).
func NewEmbedded(self Peer, peers []Peer) (*Embedded, error) {
	if err := validID(self.ID); err != nil {
		return nil, err
	}
	self.Self = true
	d := &Embedded{self: self.ID, peers: map[string]Peer{self.ID: self}}
	for _, p := range peers {
		if err := validID(p.ID); err != nil {
			return nil, err
		}
		if _, dup := d.peers[p.ID]; dup {
			return nil, fmt.Errorf("%w: duplicate id %q", ErrInvalid, p.ID)
		}
		p.Self = false
		d.peers[p.ID] = p
	}
	return d, nil
}

// Lookup implements Directory.
func (d *Embedded) Lookup(id string) (Peer, bool) {
	d.mu.RLock()
	p, ok := d.peers[id]
	d.mu.RUnlock()
	return p, ok
}

// List implements Directory.
func (d *Embedded) List() []Peer {
	d.mu.RLock()
	out := make([]Peer, 0, len(d.peers))
	for _, p := range d.peers {
		out = append(out, p)
	}
	d.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Update implements Directory.
func (d *Embedded) Update(p Peer) error {
	if err := validID(p.ID); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old, ok := d.peers[p.ID]
	if p.ID == d.self {
		if p.Addr != "" && p.Addr != old.Addr {
			return ErrSelf
		}
		if p.Epoch != 0 {
			old.Epoch = p.Epoch
		}
		d.peers[p.ID] = old
		return nil
	}
	if !ok && p.Addr == "" {
		return fmt.Errorf("%w: new peer %q has no address", ErrInvalid, p.ID)
	}
	if p.Addr == "" {
		p.Addr = old.Addr
	}
	if p.Epoch == 0 {
		p.Epoch = old.Epoch
	}
	p.Self = false
	d.peers[p.ID] = p
	return nil
}

// Remove implements Directory.
func (d *Embedded) Remove(id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if id == d.self {
		return ErrSelf
	}
	if _, ok := d.peers[id]; !ok {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	delete(d.peers, id)
	return nil
}
