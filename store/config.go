package store

import (
	"fmt"
	"log/slog"
	"math/bits"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Hard limits.
const (
	// MaxKeyLen is the longest key the store accepts.
	MaxKeyLen = 256
	// maxKeysPerCall bounds Config.MaxKeysPerCall.
	maxKeysPerCall = 1 << 16
	// maxShards bounds Config.Shards.
	maxShards = 256
)

// Config configures a Store. The zero value is a working configuration;
// see each field for its default.
type Config struct {
	// MaxKeysPerCall is the most keys one call may carry (default 1024,
	// at most 65536). A longer call fails as a whole with ErrBadCall.
	MaxKeysPerCall int
	// MaxKeyLen is the longest key in bytes (default and at most 256).
	MaxKeyLen int
	// MaxValueSize is the largest value (default and at most the pool's
	// largest block; values are one pool block each).
	MaxValueSize uint64
	// MaxPins is the most pins, over all sessions, that one key may carry
	// (default 1<<20). A pin past it is an error (ErrOverflow), never a
	// wrap-around.
	MaxPins uint32
	// MaxLeaseTTL bounds the TTL of a timed pin (default 24 h).
	MaxLeaseTTL time.Duration

	// L1Capacity is how many bytes of the pool (at block size) the store
	// may hold (default three quarters of the pool). Eviction starts when
	// the store holds more than HighWatermark of it and stops below
	// LowWatermark (defaults 0.95 and 0.85).
	L1Capacity                  uint64
	HighWatermark, LowWatermark float64
	// MaxSessionReserved is the most bytes (at block size) one session may
	// hold reserved and not yet committed or aborted (default a quarter of
	// L1Capacity). A Reserve past it fails for that key with
	// ErrReserveLimit: one client's reservations, which cannot be evicted,
	// never take the pool from the others' values.
	MaxSessionReserved uint64
	// MaxSessionPinned is the most bytes (at block size) of values one
	// session may hold pinned, by pins and leases alike (default a quarter
	// of L1Capacity, as MaxSessionReserved; at most L1Capacity). A value
	// counts once, however many pins and leases the session holds on it,
	// from its first pin until its last goes (Unpin, the lease's end,
	// Close). A pin of a value the session does not hold pinned yet that
	// would pass it fails for that key with ErrPinLimit: pinned values
	// cannot be evicted, so one client's pins never take L1 from the
	// others' puts.
	MaxSessionPinned uint64

	// WritebackRetries is how often a failed L1→L2 writeback is retried
	// before it becomes a tombstone (default 3; negative means none).
	// WritebackBackoff is the delay before each retry (default 1 s).
	// WritebackDepth bounds the writebacks in flight (default 32).
	WritebackRetries int
	WritebackBackoff time.Duration
	WritebackDepth   int

	// IODepth is the number of L2 operations in flight at most, over all
	// callers (default 256). A call that finds none free gets BUSY for the
	// keys that needed one.
	IODepth int

	// Shards splits the index (default 16, a power of two, at most 256).
	// Each shard has its own lock, hash table and LRU lists.
	Shards int
	// InitialKeys sizes the hash tables up front (a hint; default 0).
	InitialKeys int

	// CloseTimeout bounds how long Close waits for L2 operations in flight
	// (default 10 s).
	CloseTimeout time.Duration

	// L1Journal, when set, is memory that outlives the daemon (a memfd
	// kept in systemd's file descriptor store, never mapped by clients) of
	// L1JournalSize(records) bytes: the store records there where each L1
	// value lies, so that a store opened after a restart over the same
	// pool (shm.AdoptPool) serves them again (l1journal.go). Memory that
	// holds no journal of this pool is formatted.
	L1Journal []byte

	// Clock is the time source (default the wall clock).
	Clock Clock
	// Log receives lifecycle messages and rate-limited failure reports
	// (default: discarded).
	Log *slog.Logger
}

// L2 is the store's second tier: a file segment (a file or block device on
// NVMe, normally a *uring.File) and the transport that moves bytes between
// it and the pool (normally the *uring.Transport the pool is registered
// with). The store never closes either; its owner closes them after
// Store.Close.
type L2 struct {
	Transport xfer.Transport
	File      xfer.Segment
	// StagingID is the segment id of the store's private staging memory
	// (block headers); it must not collide with another segment's id.
	StagingID xfer.SegmentID
	// Align is the I/O alignment: headers and values are laid out on it
	// and every request is a multiple of it. Default: the file's O_DIRECT
	// alignment when it reports one, else 4096. A power of two, at least
	// 512.
	Align uint32
	// RegionSize is the unit in which L2 space is given to a slot size
	// (default 64 MiB, rounded to Align; at least two of the largest slots).
	// A file already formatted keeps the geometry it was formatted with.
	RegionSize uint64
	// HighWatermark and LowWatermark bound L2 usage, as fractions of its
	// slot bytes (defaults 0.95 and 0.85).
	HighWatermark, LowWatermark float64
	// VerifyOnOpen reads every block's value at recovery and drops those
	// whose checksum does not match (slow: it reads the whole used L2). The
	// default trusts headers, which are written only after their value.
	VerifyOnOpen bool
	// NoVerifyReads skips the checksum of values read back from L2.
	NoVerifyReads bool
}

// aligner is implemented by file segments that know their O_DIRECT
// alignment (*uring.File).
type aligner interface {
	Alignment() (offset, memory uint32)
}

func (c *Config) setDefaults(poolSize, maxBlock uint64) {
	if c.MaxKeysPerCall == 0 {
		c.MaxKeysPerCall = 1024
	}
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = MaxKeyLen
	}
	if c.MaxValueSize == 0 {
		c.MaxValueSize = maxBlock
	}
	if c.MaxPins == 0 {
		c.MaxPins = 1 << 20
	}
	if c.MaxLeaseTTL == 0 {
		c.MaxLeaseTTL = 24 * time.Hour
	}
	if c.L1Capacity == 0 {
		c.L1Capacity = poolSize / 4 * 3
	}
	if c.MaxSessionReserved == 0 {
		c.MaxSessionReserved = c.L1Capacity / 4
	}
	if c.MaxSessionPinned == 0 {
		c.MaxSessionPinned = c.L1Capacity / 4
	}
	if c.HighWatermark == 0 {
		c.HighWatermark = 0.95
	}
	if c.LowWatermark == 0 {
		c.LowWatermark = 0.85
	}
	if c.WritebackRetries == 0 {
		c.WritebackRetries = 3
	} else if c.WritebackRetries < 0 {
		c.WritebackRetries = 0
	}
	if c.WritebackBackoff == 0 {
		c.WritebackBackoff = time.Second
	}
	if c.WritebackDepth == 0 {
		c.WritebackDepth = 32
	}
	if c.IODepth == 0 {
		c.IODepth = 256
	}
	if c.Shards == 0 {
		c.Shards = 16
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 10 * time.Second
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

func (c *Config) validate(maxBlock uint64) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
	}
	switch {
	case c.MaxKeysPerCall < 1 || c.MaxKeysPerCall > maxKeysPerCall:
		return bad("MaxKeysPerCall=%d (want 1..%d)", c.MaxKeysPerCall, maxKeysPerCall)
	case c.MaxKeyLen < 1 || c.MaxKeyLen > MaxKeyLen:
		return bad("MaxKeyLen=%d (want 1..%d)", c.MaxKeyLen, MaxKeyLen)
	case c.MaxValueSize > maxBlock:
		return bad("MaxValueSize=%d is over the pool's largest block %d", c.MaxValueSize, maxBlock)
	case c.MaxValueSize > 1<<32-1:
		return bad("MaxValueSize=%d (want < 4 GiB)", c.MaxValueSize)
	case c.MaxPins > 1<<31:
		return bad("MaxPins=%d (want at most 2^31)", c.MaxPins)
	case c.MaxSessionPinned > c.L1Capacity:
		return bad("MaxSessionPinned=%d is over L1Capacity %d", c.MaxSessionPinned, c.L1Capacity)
	case c.MaxLeaseTTL < 0:
		return bad("MaxLeaseTTL=%v", c.MaxLeaseTTL)
	case !(c.LowWatermark > 0 && c.LowWatermark < c.HighWatermark && c.HighWatermark <= 1):
		return bad("watermarks low=%v high=%v (want 0 < low < high <= 1)", c.LowWatermark, c.HighWatermark)
	case c.WritebackBackoff < 0:
		return bad("WritebackBackoff=%v", c.WritebackBackoff)
	case c.WritebackRetries > 1000:
		return bad("WritebackRetries=%d (want at most 1000)", c.WritebackRetries)
	case c.IODepth < 4 || c.IODepth > 1<<16:
		return bad("IODepth=%d (want 4..65536)", c.IODepth)
	case c.WritebackDepth < 1:
		return bad("WritebackDepth=%d", c.WritebackDepth)
	case c.Shards < 1 || c.Shards > maxShards || bits.OnesCount(uint(c.Shards)) != 1:
		return bad("Shards=%d (want a power of two, 1..%d)", c.Shards, maxShards)
	case c.InitialKeys < 0 || c.InitialKeys > 1<<30:
		return bad("InitialKeys=%d", c.InitialKeys)
	case c.CloseTimeout < 0:
		return bad("CloseTimeout=%v", c.CloseTimeout)
	}
	return nil
}
