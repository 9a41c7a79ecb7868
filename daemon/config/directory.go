package config

import (
	"net/url"
	"path/filepath"
	"strings"
	"time"
)

// DirectoryConfig is where daemons find each other: the embedded
// directory (this daemon and the peers its config names; the default, so
// a single host needs nothing) or etcd (members under leases, the export
// catalog, a bounded-stale cache in every daemon). It is part of Config;
// its keys sit at the top level of the file.
type DirectoryConfig struct {
	// Directory is embedded or etcd.
	Directory string `toml:"directory"`
	// EtcdEndpoints are etcd's client URLs.
	EtcdEndpoints []string `toml:"etcd_endpoints"`
	// EtcdPrefix is where the directory lives in etcd ("/tensorcast/").
	EtcdPrefix string `toml:"etcd_prefix"`
	// EtcdCAFile, EtcdCertFile and EtcdKeyFile are the TLS files for
	// https endpoints (the CA, this daemon's client certificate and key).
	EtcdCAFile   string `toml:"etcd_ca_file"`
	EtcdCertFile string `toml:"etcd_cert_file"`
	EtcdKeyFile  string `toml:"etcd_key_file"`
	// EtcdLeaseTTL is the registration's lease: a daemon that dies drops
	// out within it.
	EtcdLeaseTTL Duration `toml:"etcd_lease_ttl"`
	// StalenessBudget is how old a cached directory answer may be; older
	// ones fall back as the request's lane allows, or fail UNAVAILABLE.
	// A remote get uses a home's answer it cached for as long.
	StalenessBudget Duration `toml:"staleness_budget"`

	// Clock measures the staleness budget (nil: time.Now); tests move it.
	// It is no key of the file.
	Clock func() time.Time `toml:"-"`
}

func directoryDefaults() DirectoryConfig {
	return DirectoryConfig{
		Directory:       "embedded",
		EtcdEndpoints:   []string{"http://127.0.0.1:2379"},
		EtcdPrefix:      "/tensorcast/",
		EtcdLeaseTTL:    Duration(10 * time.Second),
		StalenessBudget: Duration(2 * time.Second),
	}
}

// validateDirectory checks the directory's keys.
func (c *Config) validateDirectory() error {
	d := &c.DirectoryConfig
	switch d.Directory {
	case "embedded", "etcd":
	default:
		return badValue("directory", d.Directory, "must be embedded or etcd")
	}
	if d.Directory == "etcd" && c.PeerListen == "" {
		return badValue("directory", d.Directory, "needs peer_listen (members register their peer address)")
	}
	if d.Directory == "etcd" && len(d.EtcdEndpoints) == 0 {
		return badValue("etcd_endpoints", "", "at least one endpoint is needed with directory = etcd")
	}
	tls := d.EtcdCAFile != "" || d.EtcdCertFile != ""
	for _, e := range d.EtcdEndpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return badValue("etcd_endpoints", e, "must be an http:// or https:// URL of host:port")
		}
		if u.Scheme == "https" && d.EtcdCAFile == "" {
			return badValue("etcd_ca_file", "", "needed for the https endpoint "+e)
		}
		if u.Scheme == "http" && tls {
			return badValue("etcd_endpoints", e, "is plain http, and TLS files are set: use https://")
		}
	}
	p := d.EtcdPrefix
	if !strings.HasPrefix(p, "/") || !strings.HasSuffix(p, "/") || len(p) > 128 || strings.ContainsAny(p, " \t\n") {
		return badValue("etcd_prefix", p, "must start and end with '/', without spaces, at most 128 bytes")
	}
	for _, f := range []struct{ key, v string }{{"etcd_ca_file", d.EtcdCAFile}, {"etcd_cert_file", d.EtcdCertFile}, {"etcd_key_file", d.EtcdKeyFile}} {
		if f.v != "" && !filepath.IsAbs(f.v) {
			return badValue(f.key, f.v, "must be an absolute path")
		}
	}
	if (d.EtcdCertFile == "") != (d.EtcdKeyFile == "") {
		return badValue("etcd_cert_file", d.EtcdCertFile, "etcd_cert_file and etcd_key_file go together")
	}
	ttl := time.Duration(d.EtcdLeaseTTL)
	if ttl < time.Second || ttl > 5*time.Minute || ttl%time.Second != 0 {
		return badValue("etcd_lease_ttl", d.EtcdLeaseTTL.String(), "must be whole seconds between 1s and 5m")
	}
	b := time.Duration(d.StalenessBudget)
	if b < 10*time.Millisecond || b > 10*time.Minute {
		return badValue("staleness_budget", d.StalenessBudget.String(), "must be between 10ms and 10m")
	}
	return nil
}

// directorySettings are the directory's keys as environment variables
// and flags.
func directorySettings() []setting {
	str := func(dst func(*Config) *string) func(*Config, string) error {
		return func(c *Config, s string) error { *dst(c) = s; return nil }
	}
	return []setting{
		{"directory", "TENSORCAST_DIRECTORY", "where daemons find each other: embedded or etcd", str(func(c *Config) *string { return &c.Directory })},
		{"etcd_endpoints", "TENSORCAST_ETCD_ENDPOINTS", "etcd client URLs, comma-separated", func(c *Config, s string) error {
			c.EtcdEndpoints = nil
			for _, e := range strings.Split(s, ",") {
				if e = strings.TrimSpace(e); e != "" {
					c.EtcdEndpoints = append(c.EtcdEndpoints, e)
				}
			}
			return nil
		}},
		{"etcd_prefix", "TENSORCAST_ETCD_PREFIX", "where the directory lives in etcd", str(func(c *Config) *string { return &c.EtcdPrefix })},
		{"etcd_ca_file", "TENSORCAST_ETCD_CA_FILE", "CA of etcd's certificate (https endpoints)", str(func(c *Config) *string { return &c.EtcdCAFile })},
		{"etcd_cert_file", "TENSORCAST_ETCD_CERT_FILE", "client certificate for etcd", str(func(c *Config) *string { return &c.EtcdCertFile })},
		{"etcd_key_file", "TENSORCAST_ETCD_KEY_FILE", "client key for etcd", str(func(c *Config) *string { return &c.EtcdKeyFile })},
		{"etcd_lease_ttl", "TENSORCAST_ETCD_LEASE_TTL", "the registration's lease (whole seconds, e.g. 10s)", func(c *Config, s string) error { return c.EtcdLeaseTTL.UnmarshalText([]byte(s)) }},
		{"staleness_budget", "TENSORCAST_STALENESS_BUDGET", "how old a cached directory answer, or a home's answer a remote get uses, may be (e.g. 2s)", func(c *Config, s string) error { return c.StalenessBudget.UnmarshalText([]byte(s)) }},
	}
}
