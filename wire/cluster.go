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

// Limits of a ClusterShardsResponse.
const (
	// MaxShardsAnswer bounds the shards one answer covers (a caller pages
	// through more with First).
	MaxShardsAnswer = 4096
	// MaxShardHomes bounds the distinct homes one answer names.
	MaxShardHomes = 1024
	// NoHome, in a ClusterShardsResponse's Homes or Rendezvous, is a shard
	// with none (unclaimed).
	NoHome = 0xffff
)

// ClusterShardsRequest asks for the homes and generations of Count shards
// from First (Count 0: as many as an answer takes).
type ClusterShardsRequest struct{ First, Count uint32 }

func (*ClusterShardsRequest) Kind() RequestKind { return tcproto.RequestBodyClusterShardsRequest }

func (m *ClusterShardsRequest) fields(f *fields) {
	scalar(f, 0, &m.First)
	scalar(f, 1, &m.Count)
}

// ClusterShardsResponse is the shards from First as the daemon knows them,
// as parallel lists (one entry per shard): its home and the member
// rendezvous hashing names (indexes into HomeIDs, NoHome for none), the
// home's generation (its claim in etcd when Fenced, else its run epoch),
// and the keys indexed here (this daemon being its home). ClaimHolders and
// ClaimCounts are the read claims this daemon, as a home, has outstanding
// by holder (ClaimsOutstanding in all); Holds the reads other daemons hold
// here now.
type ClusterShardsResponse struct {
	ShardsTotal       uint32
	First             uint32
	HomeIDs           []string
	Homes             []uint16
	Generations       []uint64
	Rendezvous        []uint16
	Keys              []uint32
	ClaimHolders      []string
	ClaimCounts       []uint32
	ClaimsOutstanding uint64
	Holds             uint32
	Fenced            bool
}

func (*ClusterShardsResponse) Kind() ResponseKind { return tcproto.ResponseBodyClusterShardsResponse }

func (m *ClusterShardsResponse) fields(f *fields) {
	scalar(f, 0, &m.ShardsTotal)
	scalar(f, 1, &m.First)
	texts(f, 2, &m.HomeIDs, MaxShardHomes, MaxDaemonID)
	list(f, 3, &m.Homes, MaxShardsAnswer)
	list(f, 4, &m.Generations, MaxShardsAnswer)
	list(f, 5, &m.Rendezvous, MaxShardsAnswer)
	list(f, 6, &m.Keys, MaxShardsAnswer)
	texts(f, 7, &m.ClaimHolders, MaxShardHomes, MaxDaemonID)
	list(f, 8, &m.ClaimCounts, MaxShardHomes)
	scalar(f, 9, &m.ClaimsOutstanding)
	scalar(f, 10, &m.Holds)
	flag(f, 11, &m.Fenced)
	n := len(m.Homes)
	f.require(len(m.Generations) == n && len(m.Rendezvous) == n && len(m.Keys) == n, "shard lists of different lengths")
	f.require(len(m.ClaimCounts) == len(m.ClaimHolders), "claim lists of different lengths")
	for i := 0; i < n && f.err == nil; i++ {
		f.require((m.Homes[i] == NoHome || int(m.Homes[i]) < len(m.HomeIDs)) &&
			(m.Rendezvous[i] == NoHome || int(m.Rendezvous[i]) < len(m.HomeIDs)), "shard home out of the home list")
	}
}
