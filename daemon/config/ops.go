package config

import (
	"fmt"
	"strconv"
	"time"
)

// MetricsConfig bounds the metrics endpoint, which anyone who can reach
// metrics_address may connect to: what its connections may hold, and the
// descriptors it must leave to the control socket.
type MetricsConfig struct {
	// MetricsMaxConns is how many connections the endpoint holds at once;
	// more are closed as they come.
	MetricsMaxConns int `toml:"metrics_max_conns"`
	// MetricsHeaderTimeout bounds the wait for a request's headers: from
	// the connection's accept for its first, from a later one's first
	// byte for the others.
	MetricsHeaderTimeout Duration `toml:"metrics_header_timeout"`
	// MetricsIdleTimeout is how long a keep-alive connection may wait for
	// its next scrape.
	MetricsIdleTimeout Duration `toml:"metrics_idle_timeout"`
	// MetricsSnapshotInterval is how long one rendering of the metrics
	// serves scrapes: concurrent scrapers share it, so the daemon's
	// counters are read at most once per interval.
	MetricsSnapshotInterval Duration `toml:"metrics_snapshot_interval"`
	// MetricsReservedFDs are descriptors the endpoint never takes: it
	// refuses a connection when fewer would be left under RLIMIT_NOFILE.
	// 0 reserves max_conns + 64 (the control socket's connections and
	// room for their memfds), at most half the limit.
	MetricsReservedFDs int `toml:"metrics_reserved_fds"`
}

func metricsDefaults() MetricsConfig {
	return MetricsConfig{
		MetricsMaxConns:         16,
		MetricsHeaderTimeout:    Duration(5 * time.Second),
		MetricsIdleTimeout:      Duration(30 * time.Second),
		MetricsSnapshotInterval: Duration(time.Second),
	}
}

// MetricsReserve is the number of descriptors the metrics endpoint leaves
// to the rest of the daemon under a limit of nofile descriptors.
func (c *Config) MetricsReserve(nofile int) int {
	if c.MetricsReservedFDs > 0 {
		return c.MetricsReservedFDs
	}
	return min(c.MaxConns+64, nofile/2)
}

// MetricsOff reports whether the config serves no metrics endpoint.
func (c *Config) MetricsOff() bool { return c.MetricsAddress == "" || c.MetricsAddress == "off" }

// validateOps checks the operations keys: metrics_*, ebpf and
// ebpf_uring_sample.
func (c *Config) validateOps() error {
	if !c.MetricsOff() {
		if err := checkHostPort("metrics_address", c.MetricsAddress); err != nil {
			return badValue("metrics_address", c.MetricsAddress, `must be host:port (e.g. 127.0.0.1:9464) or "off"`)
		}
	}
	if c.MetricsMaxConns < 1 || c.MetricsMaxConns > 4096 {
		return badValue("metrics_max_conns", strconv.Itoa(c.MetricsMaxConns), "must be 1..4096")
	}
	for _, d := range []struct {
		key     string
		v       Duration
		min, mx time.Duration
	}{
		{"metrics_header_timeout", c.MetricsHeaderTimeout, 10 * time.Millisecond, time.Minute},
		{"metrics_idle_timeout", c.MetricsIdleTimeout, 10 * time.Millisecond, 10 * time.Minute},
		{"metrics_snapshot_interval", c.MetricsSnapshotInterval, time.Millisecond, time.Minute},
	} {
		if time.Duration(d.v) < d.min || time.Duration(d.v) > d.mx {
			return badValue(d.key, d.v.String(), fmt.Sprintf("must be between %v and %v", d.min, d.mx))
		}
	}
	if c.MetricsReservedFDs < 0 || c.MetricsReservedFDs > 1<<20 {
		return badValue("metrics_reserved_fds", strconv.Itoa(c.MetricsReservedFDs), "must be 0 (max_conns + 64) to 1048576")
	}
	switch c.EBPF {
	case "auto", "on", "off":
	default:
		return badValue("ebpf", c.EBPF, "must be auto, on or off")
	}
	if c.EBPFUringSample < 1 || c.EBPFUringSample > 1<<16 {
		return badValue("ebpf_uring_sample", strconv.Itoa(c.EBPFUringSample), "must be 1..65536")
	}
	return nil
}

func metricsSettings() []setting {
	num := func(dst func(*Config) *int) func(*Config, string) error {
		return func(c *Config, s string) error {
			n, err := strconv.Atoi(s)
			*dst(c) = n
			return err
		}
	}
	dur := func(dst func(*Config) *Duration) func(*Config, string) error {
		return func(c *Config, s string) error { return dst(c).UnmarshalText([]byte(s)) }
	}
	return []setting{
		{"metrics_max_conns", "TENSORCAST_METRICS_MAX_CONNS", "connections the metrics endpoint holds at once", num(func(c *Config) *int { return &c.MetricsMaxConns })},
		{"metrics_header_timeout", "TENSORCAST_METRICS_HEADER_TIMEOUT", "wait for a metrics request's headers (e.g. 5s)", dur(func(c *Config) *Duration { return &c.MetricsHeaderTimeout })},
		{"metrics_idle_timeout", "TENSORCAST_METRICS_IDLE_TIMEOUT", "an idle keep-alive metrics connection's life (e.g. 30s)", dur(func(c *Config) *Duration { return &c.MetricsIdleTimeout })},
		{"metrics_snapshot_interval", "TENSORCAST_METRICS_SNAPSHOT_INTERVAL", "scrapes within it share one rendering (e.g. 1s)", dur(func(c *Config) *Duration { return &c.MetricsSnapshotInterval })},
		{"metrics_reserved_fds", "TENSORCAST_METRICS_RESERVED_FDS", "descriptors the metrics endpoint leaves to the control socket (0: max_conns + 64)", num(func(c *Config) *int { return &c.MetricsReservedFDs })},
	}
}
