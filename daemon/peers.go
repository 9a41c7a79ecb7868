package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/directory/etcd"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/peer/plane"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
)

// newPeerPlane builds the peer plane from the config: its tcp node on
// peer_listen, or on handed, the listener a hand-off passed (finding peers in dir, the etcd directory, or in the
// configured peers) serving exports, and RDMA as rdma says, with the
// tenants' pools registered.
func newPeerPlane(cfg Config, dir *etcd.Dir, pools []xfer.MemSegment, exports *peer.Exports, homes *rdma.Homes, handed *net.TCPListener,
	log *slog.Logger) (*plane.Plane, error) {
	peers := make([]directory.Peer, len(cfg.Peers))
	for i, pc := range cfg.Peers {
		peers[i] = directory.Peer{ID: pc.ID, Addr: pc.Addr}
	}
	pc := plane.Config{
		Node: tcp.Config{
			DaemonID:       cfg.DaemonID,
			Listen:         cfg.PeerListen,
			Advertise:      cfg.PeerAdvertise,
			ClusterKeyFile: cfg.ClusterKeyFile,
			ConnsPerPeer:   cfg.PeerConns,
			SliceSize:      int(cfg.PeerSliceSize),
			Peers:          peers,
			Listener:       handed,
		},
		RDMA: plane.RDMAConfig{Mode: cfg.RDMA, Device: cfg.RDMADevice, GID: cfg.RDMAGID, QPs: cfg.RDMAQPs,
			Log: log.With("component", "rdma"), Homes: homes},
		Pools: pools,
	}
	if dir != nil {
		// A nil *etcd.Dir must not become a non-nil interface.
		pc.Node.Directory, pc.Resolver = dir, dir
	}
	p, err := plane.New(pc, exports, log.With("component", "peers"))
	switch {
	case errors.Is(err, plane.ErrRDMARequired):
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	case err != nil:
		return nil, fmt.Errorf("peer plane (peer_listen = %q, cluster_key_file = %q): %w", cfg.PeerListen, cfg.ClusterKeyFile, err)
	}
	return p, nil
}

// catalogOf is the export catalog of the etcd directory, or nil for the
// embedded one (a nil *etcd.Dir must not become a non-nil interface).
func catalogOf(d *etcd.Dir) peer.Catalog {
	if d == nil {
		return nil
	}
	return d
}
