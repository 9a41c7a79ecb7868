package config

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
)

// StoreConfig is the KV block store's part of Config: L1 is the DRAM pool,
// L2 a file (or block device) through io_uring, by default a file under
// data_dir, so that a daemon started with no setup has a working store.
// Its keys sit at the top level of the file.
type StoreConfig struct {
	// Store is on (the default) or off.
	Store string `toml:"store"`
	// StoreL2Path is the L2 file or block device: "" is data_dir/store.l2,
	// "off" runs the store in DRAM only. It must lie under data_dir or
	// allowed_files (which the file tier may open); clients may never
	// register it as a file segment.
	StoreL2Path string `toml:"store_l2_path"`
	// StoreL2Size is the L2's size; a smaller regular file is extended
	// (sparse) to it.
	StoreL2Size Size `toml:"store_l2_size"`
	// StoreL1Capacity is how much of the pool the store may hold (0: three
	// quarters of pool_size); the rest stays for clients' blocks.
	StoreL1Capacity Size `toml:"store_l1_capacity"`
	// StoreHighWatermark and StoreLowWatermark are fractions of the L1
	// capacity: over high, least recently used values are evicted (to L2,
	// or dropped without one) until under low.
	StoreHighWatermark float64 `toml:"store_high_watermark"`
	StoreLowWatermark  float64 `toml:"store_low_watermark"`
	// StoreMaxValueSize is the largest value (0: the pool's largest
	// block).
	StoreMaxValueSize Size `toml:"store_max_value_size"`
	// StoreMaxSessionReserved bounds the bytes one client session may hold
	// reserved and not yet committed (0: a quarter of the L1 capacity):
	// reservations cannot be evicted, so one client's could otherwise
	// take the pool from everyone's values.
	StoreMaxSessionReserved Size `toml:"store_max_session_reserved"`
	// StoreMaxSessionPinned bounds the bytes of the values one client
	// session may hold pinned, by pins and leases (0: a quarter of the L1
	// capacity, as store_max_session_reserved): pinned values cannot be
	// evicted, so one client's pins could otherwise take L1 from everyone's
	// puts. A value pinned more than once by one session counts once.
	StoreMaxSessionPinned Size `toml:"store_max_session_pinned"`
	// StoreMaxGrantPinned bounds the bytes of the values one tenant's
	// retention handles and placement leases hold pinned in all (0: half
	// of the L1 capacity). Each pins in a session of its own, bounded by
	// store_max_session_pinned alone, so many of them could otherwise pin
	// most of L1; a handle or lease past it is refused and pins nothing.
	StoreMaxGrantPinned Size `toml:"store_max_grant_pinned"`
	// StoreMaxKeysPerCall bounds the keys of one store call.
	StoreMaxKeysPerCall int `toml:"store_max_keys_per_call"`
	// StoreMaxLeaseTTL bounds a timed pin.
	StoreMaxLeaseTTL Duration `toml:"store_max_lease_ttl"`
	// StoreWritebackRetries is how often a failed L1→L2 writeback is
	// retried before it becomes a tombstone (counted, logged, not retried).
	StoreWritebackRetries int `toml:"store_writeback_retries"`
	// StoreMode is the mode the daemon starts in (local-first,
	// budgeted-hybrid, global-governed): its admission budgets for remote
	// work, which tcctl mode changes at run time.
	StoreMode string `toml:"store_mode"`
	// StoreShards is how many shards the store across hosts splits the
	// key space into (each with a home daemon); every daemon of a cluster
	// must use the same.
	StoreShards int `toml:"store_shards"`
	// StoreReplicas is how many copies of each value put here the store
	// across hosts keeps, this daemon's included (1: none elsewhere): the
	// others go to daemons picked by rendezvous over the key, and a
	// durable put answers once every copy is on its holder's L2.
	StoreReplicas int `toml:"store_replicas"`
	// StoreKeepL1 is auto (the default) or off. With auto and systemd's
	// file descriptor store (FileDescriptorStoreMax= in the unit, which
	// systemd says in $FDSTORE), the pools and the store's L1 journal are
	// handed to it, so that a restart, an upgrade or a crash keeps the
	// values in L1 (daemon/restart.go).
	StoreKeepL1 string `toml:"store_keep_l1"`
	// StoreHandoff is off (the default) or on. On, a daemon started while
	// another serves the same socket asks it (over SOCKET.handoff) to hand
	// over: the running one drains, closes everything that writes, and
	// passes its pools and L1 journals; the new one serves the values it
	// had (daemon/handoff.go). For a rolling update where both run at once
	// (a Kubernetes DaemonSet with maxSurge), where systemd's fd store is
	// not there. Off, a second daemon on a socket in use is refused.
	StoreHandoff string `toml:"store_handoff"`
	// StoreL1JournalRecords is how many L1 values the journal can record
	// (0: one per 16 KiB of the L1 capacity, at least 4096); values past
	// it are served as ever but not kept across a restart. A record takes
	// 320 bytes of DRAM.
	StoreL1JournalRecords int `toml:"store_l1_journal_records"`
}

func storeDefaults() StoreConfig {
	return StoreConfig{
		Store:                 "on",
		StoreL2Size:           1 << 30,
		StoreHighWatermark:    0.95,
		StoreLowWatermark:     0.85,
		StoreMaxKeysPerCall:   1024,
		StoreMaxLeaseTTL:      Duration(24 * time.Hour),
		StoreWritebackRetries: 3,
		StoreMode:             grant.BudgetedHybrid.String(),
		StoreShards:           1024,
		StoreReplicas:         1,
		StoreKeepL1:           "auto",
		StoreHandoff:          "off",
	}
}

// Bounds of the store's keys.
const (
	minStoreL2Size = 64 << 20
	maxStoreKeys   = 1<<16 - 1 // a queue entry's key count is a u16
	// maxL1JournalRecords bounds store_l1_journal_records (320 GiB of
	// records).
	maxL1JournalRecords = 1 << 30
)

// L1JournalRecords is the number of records of a tenant's L1 journal over a
// pool of poolSize bytes.
func (c *Config) L1JournalRecords(poolSize Size) int {
	if n := c.StoreL1JournalRecords; n != 0 {
		return n
	}
	l1 := c.StoreL1Capacity
	if l1 == 0 || l1 > poolSize {
		l1 = poolSize / 4 * 3
	}
	return int(min(max(uint64(l1)/(16<<10), 4096), maxL1JournalRecords))
}

// StoreL2 is the L2's path, "" for none.
func (c *Config) StoreL2() string {
	switch c.StoreL2Path {
	case "off":
		return ""
	case "":
		return filepath.Join(c.DataDir, "store.l2")
	}
	return c.StoreL2Path
}

// validateStore checks the store's keys.
func (c *Config) validateStore() error {
	s := &c.StoreConfig
	if s.Store != "on" && s.Store != "off" {
		return badValue("store", s.Store, "must be on or off")
	}
	if _, err := grant.ParseMode(s.StoreMode); err != nil {
		return badValue("store_mode", s.StoreMode, "must be local-first, budgeted-hybrid or global-governed")
	}
	if p := s.StoreL2Path; p != "" && p != "off" {
		if !filepath.IsAbs(p) {
			return badValue("store_l2_path", p, `must be an absolute path, "off", or empty for data_dir/store.l2`)
		}
		if !c.fileTierMayOpen(p) {
			return badValue("store_l2_path", p, "must lie under data_dir or allowed_files (the file tier opens nothing else)")
		}
	}
	if s.StoreL2Size < minStoreL2Size || s.StoreL2Size > maxPoolSize<<4 {
		return badValue("store_l2_size", s.StoreL2Size.String(), fmt.Sprintf("must be between %s and %s", Size(minStoreL2Size), Size(maxPoolSize<<4)))
	}
	if s.StoreL1Capacity != 0 && (s.StoreL1Capacity < 1<<20 || s.StoreL1Capacity > c.PoolSize) {
		return badValue("store_l1_capacity", s.StoreL1Capacity.String(), "must be 0 (three quarters of pool_size) or between 1MiB and pool_size")
	}
	// Each tenant's store lives in the tenant's own pool: a store whose L1
	// were larger than its pool would never reach its watermarks, so it
	// would never evict, and its puts would fail once the pool is full.
	for _, t := range c.Tenants {
		size := c.TenantPoolSize(t)
		if s.StoreL1Capacity > size {
			return badValue("store_l1_capacity", s.StoreL1Capacity.String(), fmt.Sprintf("must be at most each tenant's pool_size (tenant %q has %s)", t.Name, size))
		}
		if s.StoreMaxSessionReserved > size {
			return badValue("store_max_session_reserved", s.StoreMaxSessionReserved.String(), fmt.Sprintf("must be at most each tenant's pool_size (tenant %q has %s)", t.Name, size))
		}
	}
	if !(s.StoreLowWatermark > 0 && s.StoreLowWatermark < s.StoreHighWatermark && s.StoreHighWatermark <= 1) {
		return badValue("store_low_watermark", fmt.Sprintf("%g (high %g)", s.StoreLowWatermark, s.StoreHighWatermark),
			"watermarks must be 0 < store_low_watermark < store_high_watermark <= 1")
	}
	if s.StoreMaxValueSize > shm.DefaultMaxBlock {
		return badValue("store_max_value_size", s.StoreMaxValueSize.String(), fmt.Sprintf("must be at most the pool's largest block (%s); 0 is that", Size(shm.DefaultMaxBlock)))
	}
	if s.StoreMaxSessionReserved != 0 && (s.StoreMaxSessionReserved < Size(shm.DefaultMaxBlock) || s.StoreMaxSessionReserved > c.PoolSize) {
		return badValue("store_max_session_reserved", s.StoreMaxSessionReserved.String(),
			fmt.Sprintf("must be 0 (a quarter of the L1 capacity) or between the largest value (%s) and pool_size", Size(shm.DefaultMaxBlock)))
	}
	if s.StoreMaxSessionPinned != 0 && s.StoreMaxSessionPinned < Size(shm.DefaultMaxBlock) {
		return badValue("store_max_session_pinned", s.StoreMaxSessionPinned.String(),
			fmt.Sprintf("must be 0 (a quarter of the L1 capacity) or between the largest value (%s) and the L1 capacity", Size(shm.DefaultMaxBlock)))
	}
	if s.StoreMaxGrantPinned != 0 && s.StoreMaxGrantPinned < Size(shm.DefaultMaxBlock) {
		return badValue("store_max_grant_pinned", s.StoreMaxGrantPinned.String(),
			fmt.Sprintf("must be 0 (half of the L1 capacity) or between the largest value (%s) and the L1 capacity", Size(shm.DefaultMaxBlock)))
	}
	// A session's pins, and a tenant's handles' and leases', are bounded
	// by its store's L1 (store_l1_capacity, or three quarters of the
	// tenant's pool), in each tenant's pool.
	for _, t := range c.TenantList() {
		l1 := s.StoreL1Capacity
		if l1 == 0 {
			l1 = c.TenantPoolSize(t) / 4 * 3
		}
		for _, k := range [...]struct {
			name string
			v    Size
		}{{"store_max_session_pinned", s.StoreMaxSessionPinned}, {"store_max_grant_pinned", s.StoreMaxGrantPinned}} {
			if k.v <= l1 {
				continue
			}
			why := fmt.Sprintf("must be at most the L1 capacity (%s)", l1)
			if len(c.Tenants) > 0 {
				why = fmt.Sprintf("must be at most each tenant's L1 capacity (tenant %q has %s)", t.Name, l1)
			}
			return badValue(k.name, k.v.String(), why)
		}
	}
	if s.StoreMaxKeysPerCall < 1 || s.StoreMaxKeysPerCall > maxStoreKeys {
		return badValue("store_max_keys_per_call", strconv.Itoa(s.StoreMaxKeysPerCall), fmt.Sprintf("must be between 1 and %d", maxStoreKeys))
	}
	if d := time.Duration(s.StoreMaxLeaseTTL); d < time.Second || d > 30*24*time.Hour {
		return badValue("store_max_lease_ttl", s.StoreMaxLeaseTTL.String(), "must be between 1s and 720h")
	}
	if s.StoreShards < 1 || s.StoreShards > 1<<16 {
		return badValue("store_shards", strconv.Itoa(s.StoreShards), "must be between 1 and 65536")
	}
	if s.StoreReplicas < 1 || s.StoreReplicas > store.MaxReplicas {
		return badValue("store_replicas", strconv.Itoa(s.StoreReplicas), fmt.Sprintf("must be between 1 (no copy elsewhere) and %d", store.MaxReplicas))
	}
	if s.StoreKeepL1 != "auto" && s.StoreKeepL1 != "off" {
		return badValue("store_keep_l1", s.StoreKeepL1, "must be auto or off")
	}
	if s.StoreHandoff != "on" && s.StoreHandoff != "off" {
		return badValue("store_handoff", s.StoreHandoff, "must be on or off")
	}
	if s.StoreL1JournalRecords < 0 || s.StoreL1JournalRecords > maxL1JournalRecords {
		return badValue("store_l1_journal_records", strconv.Itoa(s.StoreL1JournalRecords), fmt.Sprintf("must be 0 (one per 16KiB of store_l1_capacity) or between 1 and %d", maxL1JournalRecords))
	}
	if s.StoreWritebackRetries < 0 || s.StoreWritebackRetries > 1000 {
		return badValue("store_writeback_retries", strconv.Itoa(s.StoreWritebackRetries), "must be between 0 and 1000")
	}
	return nil
}

// fileTierMayOpen reports whether p lies under data_dir or an entry of
// allowed_files (or is one), which is what the file tier may open.
func (c *Config) fileTierMayOpen(p string) bool {
	for _, dir := range append([]string{c.DataDir}, c.AllowedFiles...) {
		if rel, err := filepath.Rel(dir, p); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return true
		}
	}
	return false
}

// storeSettings are the store's keys as environment variables and flags.
func storeSettings() []setting {
	str := func(dst func(*Config) *string) func(*Config, string) error {
		return func(c *Config, s string) error { *dst(c) = s; return nil }
	}
	size := func(dst func(*Config) *Size) func(*Config, string) error {
		return func(c *Config, s string) error { return dst(c).UnmarshalText([]byte(s)) }
	}
	num := func(dst func(*Config) *int) func(*Config, string) error {
		return func(c *Config, s string) error {
			n, err := strconv.Atoi(s)
			*dst(c) = n
			return err
		}
	}
	frac := func(dst func(*Config) *float64) func(*Config, string) error {
		return func(c *Config, s string) error {
			f, err := strconv.ParseFloat(s, 64)
			*dst(c) = f
			return err
		}
	}
	return []setting{
		{"store", "TENSORCAST_STORE", "the KV block store: on or off", str(func(c *Config) *string { return &c.Store })},
		{"store_l2_path", "TENSORCAST_STORE_L2_PATH", `the store's L2 file or device ("": data_dir/store.l2, "off": DRAM only)`, str(func(c *Config) *string { return &c.StoreL2Path })},
		{"store_l2_size", "TENSORCAST_STORE_L2_SIZE", "the store's L2 size (e.g. 1GiB)", size(func(c *Config) *Size { return &c.StoreL2Size })},
		{"store_l1_capacity", "TENSORCAST_STORE_L1_CAPACITY", "pool bytes the store may hold (0: three quarters of pool_size)", size(func(c *Config) *Size { return &c.StoreL1Capacity })},
		{"store_high_watermark", "TENSORCAST_STORE_HIGH_WATERMARK", "L1 fraction over which the store evicts", frac(func(c *Config) *float64 { return &c.StoreHighWatermark })},
		{"store_low_watermark", "TENSORCAST_STORE_LOW_WATERMARK", "L1 fraction eviction brings the store under", frac(func(c *Config) *float64 { return &c.StoreLowWatermark })},
		{"store_max_value_size", "TENSORCAST_STORE_MAX_VALUE_SIZE", "largest value (0: the pool's largest block)", size(func(c *Config) *Size { return &c.StoreMaxValueSize })},
		{"store_max_session_reserved", "TENSORCAST_STORE_MAX_SESSION_RESERVED", "bytes one client may hold reserved and not committed (0: a quarter of store_l1_capacity)", size(func(c *Config) *Size { return &c.StoreMaxSessionReserved })},
		{"store_max_session_pinned", "TENSORCAST_STORE_MAX_SESSION_PINNED", "bytes of values one client may hold pinned (0: a quarter of store_l1_capacity)", size(func(c *Config) *Size { return &c.StoreMaxSessionPinned })},
		{"store_max_grant_pinned", "TENSORCAST_STORE_MAX_GRANT_PINNED", "bytes of values one tenant's retention handles and placement leases may hold pinned in all (0: half of store_l1_capacity)", size(func(c *Config) *Size { return &c.StoreMaxGrantPinned })},
		{"store_max_keys_per_call", "TENSORCAST_STORE_MAX_KEYS_PER_CALL", "most keys of one store call", num(func(c *Config) *int { return &c.StoreMaxKeysPerCall })},
		{"store_max_lease_ttl", "TENSORCAST_STORE_MAX_LEASE_TTL", "longest timed pin (e.g. 24h)", func(c *Config, s string) error { return c.StoreMaxLeaseTTL.UnmarshalText([]byte(s)) }},
		{"store_writeback_retries", "TENSORCAST_STORE_WRITEBACK_RETRIES", "retries of a failed writeback before it is a tombstone", num(func(c *Config) *int { return &c.StoreWritebackRetries })},
		{"store_mode", "TENSORCAST_STORE_MODE", "admission budgets for remote work: local-first, budgeted-hybrid or global-governed", str(func(c *Config) *string { return &c.StoreMode })},
		{"store_shards", "TENSORCAST_STORE_SHARDS", "shards of the store across hosts (the same on every daemon)", num(func(c *Config) *int { return &c.StoreShards })},
		{"store_replicas", "TENSORCAST_STORE_REPLICAS", "copies of each value the store across hosts keeps, this daemon's included (1: none elsewhere)", num(func(c *Config) *int { return &c.StoreReplicas })},
		{"store_keep_l1", "TENSORCAST_STORE_KEEP_L1", "keep L1 values across restarts through systemd's fd store: auto or off", str(func(c *Config) *string { return &c.StoreKeepL1 })},
		{"store_handoff", "TENSORCAST_STORE_HANDOFF", "take the pools and L1 values over from a daemon running on the same socket: on or off", str(func(c *Config) *string { return &c.StoreHandoff })},
		{"store_l1_journal_records", "TENSORCAST_STORE_L1_JOURNAL_RECORDS", "L1 values kept across a restart at most (0: one per 16KiB of store_l1_capacity)", num(func(c *Config) *int { return &c.StoreL1JournalRecords })},
	}
}
