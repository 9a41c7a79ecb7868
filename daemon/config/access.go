package config

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// AccessConfig is who may use the control socket and how much: tenants,
// per-uid connection limits, and the socket's timeouts.
type AccessConfig struct {
	// MaxConnsPerUID bounds one uid's connections, so one local user
	// cannot lock everyone out; 0 means max_conns/4 (at least 1).
	MaxConnsPerUID int `toml:"max_conns_per_uid"`
	// DeniedUIDs are refused whatever else says. Root and the daemon's own
	// uid may always connect unless they are named here.
	DeniedUIDs []uint32 `toml:"denied_uids"`
	// FrameTimeout bounds the time a frame may take to arrive once its
	// first byte has; an idle connection (no partial frame) may stay open.
	FrameTimeout Duration `toml:"frame_timeout"`
	// AcceptStallTimeout is how long accepting may keep failing (out of fds
	// or memory, retried with back-off) before the daemon reports itself
	// unhealthy and stops its watchdog keep-alives, so systemd restarts it.
	AcceptStallTimeout Duration `toml:"accept_stall_timeout"`
	// Tenants are sets of users that share a pool: [[tenants]] name = "a",
	// uids = [...], gids = [...], pool_size = "1GiB". Each tenant has its
	// own pool (its own memfd); a client maps only its tenant's, and no
	// byte of one tenant is readable by another. None configured means one
	// tenant, "default", of allowed_uids and allowed_gids with pool_size.
	Tenants []TenantConfig `toml:"tenants"`
}

// TenantConfig is one [[tenants]] table.
type TenantConfig struct {
	Name string   `toml:"name"`
	UIDs []uint32 `toml:"uids"`
	GIDs []uint32 `toml:"gids"`
	// PoolSize is the tenant's pool, which is its pool quota; 0 means
	// pool_size.
	PoolSize Size `toml:"pool_size"`
	// AllowedFiles are the directories and block devices, beside its own
	// directory data_dir/tenants/NAME, that the tenant's clients may open
	// file segments in. With [[tenants]] a tenant's client opens files only
	// there (a relative path is taken in its own directory); the global
	// allowed_files are then for root and the daemon's uid.
	AllowedFiles []string `toml:"allowed_files"`
}

func accessDefaults() AccessConfig {
	return AccessConfig{
		FrameTimeout:       Duration(5 * time.Second),
		AcceptStallTimeout: Duration(30 * time.Second),
	}
}

// maxTenants bounds [[tenants]].
const maxTenants = 64

// validateAccess checks the access keys.
func (c *Config) validateAccess() error {
	if c.MaxConnsPerUID < 0 || c.MaxConnsPerUID > c.MaxConns {
		return badValue("max_conns_per_uid", strconv.Itoa(c.MaxConnsPerUID), fmt.Sprintf("must be between 0 (max_conns/4) and max_conns (%d)", c.MaxConns))
	}
	if d := time.Duration(c.FrameTimeout); d < 10*time.Millisecond || d > 10*time.Minute {
		return badValue("frame_timeout", c.FrameTimeout.String(), "must be between 10ms and 10m")
	}
	if d := time.Duration(c.AcceptStallTimeout); d < 100*time.Millisecond || d > time.Hour {
		return badValue("accept_stall_timeout", c.AcceptStallTimeout.String(), "must be between 100ms and 1h")
	}
	if len(c.Tenants) == 0 {
		return nil
	}
	if len(c.Tenants) > maxTenants {
		return badValue("tenants", strconv.Itoa(len(c.Tenants)), fmt.Sprintf("at most %d tenants", maxTenants))
	}
	if len(c.AllowedUIDs) > 0 || len(c.AllowedGIDs) > 0 {
		return badValue("allowed_uids", fmt.Sprint(c.AllowedUIDs, c.AllowedGIDs), "must be empty with [[tenants]]: list the users in their tenants")
	}
	names := map[string]bool{}
	uids, gids := map[uint32]string{}, map[uint32]string{}
	var total uint64
	for _, t := range c.Tenants {
		if !validTenantName(t.Name) {
			return badValue("tenants.name", t.Name, "must be 1..64 bytes of A-Za-z0-9._-")
		}
		if names[t.Name] {
			return badValue("tenants.name", t.Name, "appears twice")
		}
		names[t.Name] = true
		if len(t.UIDs) == 0 && len(t.GIDs) == 0 {
			return badValue("tenants.uids", t.Name, "a tenant needs uids or gids")
		}
		for _, u := range t.UIDs {
			if o, dup := uids[u]; dup {
				return badValue("tenants.uids", strconv.FormatUint(uint64(u), 10), fmt.Sprintf("is in tenants %q and %q", o, t.Name))
			}
			uids[u] = t.Name
		}
		for _, g := range t.GIDs {
			if o, dup := gids[g]; dup {
				return badValue("tenants.gids", strconv.FormatUint(uint64(g), 10), fmt.Sprintf("is in tenants %q and %q", o, t.Name))
			}
			gids[g] = t.Name
		}
		for _, p := range t.AllowedFiles {
			if !filepath.IsAbs(p) {
				return badValue("tenants.allowed_files", p, "must be an absolute path")
			}
		}
		size := c.TenantPoolSize(t)
		if size < minPoolSize || size > maxPoolSize {
			return badValue("tenants.pool_size", size.String(), fmt.Sprintf("must be between %s and %s", Size(minPoolSize), Size(maxPoolSize)))
		}
		total += uint64(size)
	}
	if total > maxPoolSize {
		return badValue("tenants.pool_size", Size(total).String(), fmt.Sprintf("the tenants' pools add up to more than %s", Size(maxPoolSize)))
	}
	return nil
}

// TenantPoolSize is t's pool size: its own, else pool_size.
func (c *Config) TenantPoolSize(t TenantConfig) Size {
	if t.PoolSize == 0 {
		return c.PoolSize
	}
	return t.PoolSize
}

// TenantList is the configured tenants, or the default one.
func (c *Config) TenantList() []TenantConfig {
	if len(c.Tenants) > 0 {
		return c.Tenants
	}
	return []TenantConfig{{Name: "default", UIDs: c.AllowedUIDs, GIDs: c.AllowedGIDs, PoolSize: c.PoolSize}}
}

func validTenantName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == ""
}

// parseUIDs reads a comma-separated list of uids (env and flags).
func parseUIDs(s string) ([]uint32, error) {
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("not a uid: %q", f)
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

func accessSettings() []setting {
	return []setting{
		{"max_conns_per_uid", "TENSORCAST_MAX_CONNS_PER_UID", "most client connections of one uid (0: max_conns/4)", func(c *Config, s string) error {
			n, err := strconv.Atoi(s)
			c.MaxConnsPerUID = n
			return err
		}},
		{"denied_uids", "TENSORCAST_DENIED_UIDS", "uids refused, root and the daemon's own included (comma-separated)", func(c *Config, s string) error {
			u, err := parseUIDs(s)
			c.DeniedUIDs = u
			return err
		}},
		{"frame_timeout", "TENSORCAST_FRAME_TIMEOUT", "time a started control frame may take to arrive (e.g. 5s)", func(c *Config, s string) error { return c.FrameTimeout.UnmarshalText([]byte(s)) }},
		{"accept_stall_timeout", "TENSORCAST_ACCEPT_STALL_TIMEOUT", "failing accepts for this long make the daemon unhealthy (e.g. 30s)", func(c *Config, s string) error {
			return c.AcceptStallTimeout.UnmarshalText([]byte(s))
		}},
	}
}
