package plane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/tcp"
)

// Resolver is a multi-host directory as the plane uses it when it opens a
// remote segment (*etcd.Dir): it resolves a member as a request's lane
// allows (from its cache within the staleness budget, or from the store),
// and learns from what the owner then answers.
type Resolver interface {
	ResolveMember(ctx context.Context, lane directory.Lane, id string) (directory.MemberView, error)
	// Observe: the member answered as itself, at epoch.
	Observe(id string, epoch uint64, m directory.Member)
	// Unreachable: the member did not answer as itself at the address
	// the directory gave.
	Unreachable(id string, err error)
	// ExportGone: the owner no longer exports name.
	ExportGone(owner, name string)
}

// openResolved is OpenRemote with a Resolver. The lookup may fail closed
// (peer.ErrUnavailable: nothing cached within the budget and the lane may not,
// or could not, ask the store), find nothing (peer.ErrNotFound), or give an
// address that the owner's handshake and token then confirm or refute: a
// peer that does not answer as itself there, or refuses the export, is an
// error for the caller and a correction for the cache.
func (p *Plane) openResolved(ctx peer.OpenContext, peerID string, a tcp.Access, rights, transport uint8) (peer.RemoteSegment, error) {
	segment := a.Name
	lane, err := directory.ParseLane(ctx.Lane)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", peer.ErrInvalid, err)
	}
	v, err := p.dir.ResolveMember(context.Background(), lane, peerID)
	switch {
	case errors.Is(err, directory.ErrNotFound):
		return nil, fmt.Errorf("%w: %w", peer.ErrNotFound, err)
	case err != nil:
		p.log.Debug("remote segment refused: the directory cannot answer", "peer", peerID, "name", segment, "lane", lane.String(), "err", err)
		return nil, fmt.Errorf("%w: %w", peer.ErrUnavailable, err)
	}
	r, err := p.open(peerID, a, rights, transport)
	switch {
	case err == nil:
		p.dir.Observe(peerID, r.Epoch(), v.Member)
		return r, nil
	case errors.Is(err, tcp.ErrNotFound):
		p.dir.ExportGone(peerID, segment)
	case errors.Is(err, tcp.ErrConnLost), errors.Is(err, tcp.ErrAuth), errors.Is(err, tcp.ErrRefused):
		p.dir.Unreachable(peerID, err)
		age := "never synced"
		if v.Age != directory.Never {
			age = v.Age.Round(time.Millisecond).String() + " old"
		}
		return nil, fmt.Errorf("%w: %s did not answer as itself at %s, the address the directory gave (%s, %s): %w",
			peer.ErrUnavailable, peerID, v.Member.Addr, v.Source, age, err)
	}
	return nil, err
}
