package wire

import "github.com/tensorcast/tensorcast/fbs/tcproto"

// Limits of a ClusterLocateResponse.
const (
	// MaxLocateHolders bounds the holders one answer names.
	MaxLocateHolders = 16
	// MaxDaemonID is the longest daemon id.
	MaxDaemonID = 64
)

// ClusterLocateRequest asks where Key lives in the store across hosts.
type ClusterLocateRequest struct{ Key []byte }

func (*ClusterLocateRequest) Kind() RequestKind { return tcproto.RequestBodyClusterLocateRequest }

func (m *ClusterLocateRequest) fields(f *fields) {
	blob(f, 0, &m.Key, MaxStoreKey)
	f.require(len(m.Key) > 0, "empty key")
}

// ClusterLocateResponse is Key's shard, the shard's home and generation as
// the daemon knows them, and the holders the home names: daemon id, the
// epoch that announced the copy, tier (1 DRAM, 2 NVMe), size and crc32c,
// as parallel lists.
type ClusterLocateResponse struct {
	Shard        uint32
	Home         string
	Generation   uint64
	Holders      []string
	HolderEpochs []uint64
	HolderTiers  []uint8
	HolderSizes  []uint64
	HolderCRCs   []uint32
}

func (*ClusterLocateResponse) Kind() ResponseKind { return tcproto.ResponseBodyClusterLocateResponse }

func (m *ClusterLocateResponse) fields(f *fields) {
	scalar(f, 0, &m.Shard)
	text(f, 1, &m.Home, MaxDaemonID)
	scalar(f, 2, &m.Generation)
	texts(f, 3, &m.Holders, MaxLocateHolders, MaxDaemonID)
	list(f, 4, &m.HolderEpochs, MaxLocateHolders)
	list(f, 5, &m.HolderTiers, MaxLocateHolders)
	list(f, 6, &m.HolderSizes, MaxLocateHolders)
	list(f, 7, &m.HolderCRCs, MaxLocateHolders)
	n := len(m.Holders)
	f.require(len(m.HolderEpochs) == n && len(m.HolderTiers) == n && len(m.HolderSizes) == n && len(m.HolderCRCs) == n,
		"holder lists of different lengths")
}
