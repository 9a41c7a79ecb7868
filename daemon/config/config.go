// Package daemon wires tensorcastd together: configuration (file, flags,
// environment), the parts it builds from it in order (the tenants' pools,
// the segment registry, the transports: local, the io_uring file tier, the
// export table and the peer plane of package peer/plane; the transfer
// engine and its router, the KV block store, the control server, the
// metrics endpoint and eBPF views), and the process lifecycle under
// systemd (READY, WATCHDOG, STOPPING, the bounded drain and the order the
// parts close in). What each part does is its own package's.
package config

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/tensorcast/tensorcast/reactor"
)

// Config is everything tensorcastd reads at start-up. Precedence, lowest
// first: the embedded defaults, the TOML file (--config), TENSORCAST_*
// environment variables, command-line flags.
type Config struct {
	// Socket is the control socket path.
	Socket string `toml:"socket"`
	// SocketMode is the control socket's permission bits (octal in files).
	SocketMode FileMode `toml:"socket_mode"`
	// DataDir holds the daemon's state (the L2 tier later); created if absent.
	DataDir string `toml:"data_dir"`
	// PoolSize is the DRAM pool size in bytes ("256MiB", "2GiB", "1g").
	PoolSize Size `toml:"pool_size"`
	// DataWorkers is how many reactor workers serve the clients' queues,
	// each on its own thread with its own io_uring ring; 0 (the default)
	// is one per CPU the daemon may run on.
	DataWorkers int `toml:"data_workers"`
	// DataDoorbell is how a client wakes a sleeping worker: auto (the
	// default: a futex where the kernel's io_uring can wait on one, Linux
	// 6.7, else an eventfd per queue), futex, eventfd.
	DataDoorbell string `toml:"data_doorbell"`
	// DataPoll is how long a worker that answered its queues' last
	// requests looks for their clients' next ones before it sleeps
	// (reactor/poll.go): 50µs by default, 0 never, at most 1ms.
	DataPoll Duration `toml:"data_poll"`
	// Hugepages is auto (hugetlb pages, else transparent huge pages, else
	// normal pages, and say which), on (fail without hugetlb pages), off
	// (normal pages).
	Hugepages string `toml:"hugepages"`
	// MaxFrame bounds one control frame.
	MaxFrame Size `toml:"max_frame"`
	// MaxConns bounds concurrent client connections.
	MaxConns int `toml:"max_conns"`
	// MaxBufferSize bounds one client-registered buffer.
	MaxBufferSize Size `toml:"max_buffer_size"`
	// AllowedUIDs and AllowedGIDs may connect (a gid matches the primary
	// group or any supplementary one); root and the daemon's own uid always
	// may, unless denied_uids names them. They are the default tenant's
	// users; with [[tenants]] they must be empty.
	AllowedUIDs []uint32 `toml:"allowed_uids"`
	AllowedGIDs []uint32 `toml:"allowed_gids"`
	// DrainTimeout bounds the shutdown drain.
	DrainTimeout Duration `toml:"drain_timeout"`
	// LogFormat is text or json; LogLevel debug, info, warn or error.
	LogFormat string `toml:"log_format"`
	LogLevel  string `toml:"log_level"`
	// AllowedFiles lists the directories and devices that file segments may
	// be opened in (io_uring tier); empty means none.
	AllowedFiles []string `toml:"allowed_files"`

	// DaemonID names this daemon among its peers (default: the hostname).
	DaemonID string `toml:"daemon_id"`
	// PeerListen is the host:port of the peer data plane; empty (the
	// default) runs no peer plane.
	PeerListen string `toml:"peer_listen"`
	// PeerAdvertise is the address peers are told to dial (default: the
	// bound listen address).
	PeerAdvertise string `toml:"peer_advertise"`
	// ClusterKeyFile holds the key every daemon of the cluster shares
	// (mode 0600); required with peer_listen.
	ClusterKeyFile string `toml:"cluster_key_file"`
	// Peers are the other daemons: [[peers]] id = "...", addr = "host:port".
	// Only the daemons listed here (or in the directory) are accepted on
	// the peer port. A peer listed without an addr is accepted when it
	// dials in and dialed at the address it advertises then.
	Peers []PeerConfig `toml:"peers"`
	// PeerConns is the number of connections per peer.
	PeerConns int `toml:"peer_conns"`
	// PeerSliceSize is the largest payload of one peer frame.
	PeerSliceSize Size `toml:"peer_slice_size"`
	// RDMA is auto (use an RDMA device for peers when one is usable, else
	// tcp, saying why), on (fail start-up without one) or off.
	RDMA string `toml:"rdma"`
	// RDMADevice names the RDMA device ("" = the first with an active port).
	RDMADevice string `toml:"rdma_device"`
	// RDMAGID overrides the RoCE v2 GID: a GID table index or an address
	// ("" = the IPv4-mapped GID of the device's netdev).
	RDMAGID string `toml:"rdma_gid"`
	// RDMAQPs is how many RC queue pairs each peer's link spreads its
	// requests over.
	RDMAQPs int `toml:"rdma_qps"`
	// RDMAInlineRead is the largest value a remote get of one key reads
	// from a holder reached by rdma in the answer to one peer exchange
	// (its bytes on the peer channel, one round trip) rather than by a
	// hold and an RDMA READ (two round trips and a release); the keys of a
	// get of several go by one hold and a batch of READs. 0 reads every
	// value by rdma.
	RDMAInlineRead Size `toml:"rdma_inline_read"`

	// MetricsAddress is the host:port of the Prometheus endpoint
	// (/metrics); "off" or "" serves none. Port 0 picks a free one.
	MetricsAddress string `toml:"metrics_address"`
	// MetricsConfig bounds the endpoint (ops.go).
	MetricsConfig
	// EBPF is auto (load the kernel-side views when the daemon may and the
	// kernel has the hooks, else say which is missing and run without),
	// on (fail start-up without them) or off.
	EBPF string `toml:"ebpf"`
	// EBPFUringSample is how many io_uring requests there are, on
	// average, for each one the uring view times (1 times all). Timing a
	// request costs the kernel a map update and delete; the others cost
	// one read and one test.
	EBPFUringSample int `toml:"ebpf_uring_sample"`
	// DirectoryConfig is where daemons find each other (config_directory.go).
	DirectoryConfig
	// AccessConfig is tenants, per-uid limits and the control socket's
	// timeouts (config_access.go).
	AccessConfig
	// StoreConfig is the KV block store's (config_store.go).
	StoreConfig
}

// PeerConfig is one configured peer daemon.
type PeerConfig struct {
	ID   string `toml:"id"`
	Addr string `toml:"addr"`
}

// Defaults serve a single small host with no setup.
func Defaults() Config {
	return Config{
		Socket:        "/run/tensorcast/tensorcastd.sock",
		SocketMode:    0o660,
		DataDir:       "/var/lib/tensorcast",
		PoolSize:      256 << 20,
		Hugepages:     "auto",
		DataDoorbell:  "auto",
		DataPoll:      Duration(reactor.DefaultPoll),
		MaxFrame:      1 << 20,
		MaxConns:      256,
		MaxBufferSize: 16 << 30,
		DrainTimeout:  Duration(10 * time.Second),
		LogFormat:     "text",
		LogLevel:      "info",
		DaemonID:      hostID(),
		PeerConns:     4,
		RDMAQPs:       2,
		PeerSliceSize: 1 << 20,
		RDMA:          "auto",
		// RDMAInlineRead: copying 32 KiB on each side costs less than the
		// round trip and the release a hold adds to the READ.
		RDMAInlineRead: 32 << 10,
		// MetricsAddress: loopback, so nothing is exposed off the host
		// until the operator says so.
		MetricsAddress:  "127.0.0.1:9464",
		MetricsConfig:   metricsDefaults(),
		EBPF:            "auto",
		EBPFUringSample: 16,

		DirectoryConfig: directoryDefaults(),
		AccessConfig:    accessDefaults(),
		StoreConfig:     storeDefaults(),
	}
}

// Limits on values that come from outside.
const (
	minPoolSize = 4 << 20
	maxPoolSize = 1 << 40
	minFrame    = 4 << 10
	maxFrame    = 64 << 20
	maxConns    = 65536
	maxDrain    = 10 * time.Minute
)

// MaxDrainTimeout is the longest drain_timeout a config accepts. A daemon
// taking over from another (daemon/handoff.go) waits for the old one's
// drain no longer than this, whatever that one states.
const MaxDrainTimeout = maxDrain

// relativePath is why a relative socket or data_dir is refused: the
// daemon's state would depend on the directory it is started in, which
// under systemd is /.
const relativePath = "must be an absolute path (a relative one would depend on the directory the daemon is started in: / under systemd)"

// Validate checks every value and names the first bad key and its value.
func (c *Config) Validate() error {
	switch {
	case c.Socket == "":
		return badValue("socket", c.Socket, "must not be empty")
	case !filepath.IsAbs(c.Socket):
		return badValue("socket", c.Socket, relativePath)
	case len(c.Socket) > 107:
		return badValue("socket", c.Socket, "longer than a unix socket path may be (107 bytes)")
	case c.SocketMode&^0o777 != 0 || c.SocketMode&0o600 != 0o600:
		return badValue("socket_mode", fmt.Sprintf("%#o", uint32(c.SocketMode)), "must be permission bits including 0600")
	case c.DataDir == "":
		return badValue("data_dir", c.DataDir, "must not be empty")
	case !filepath.IsAbs(c.DataDir):
		return badValue("data_dir", c.DataDir, relativePath)
	case c.PoolSize < minPoolSize || c.PoolSize > maxPoolSize:
		return badValue("pool_size", c.PoolSize.String(), fmt.Sprintf("must be between %s and %s", Size(minPoolSize), Size(maxPoolSize)))
	case c.Hugepages != "auto" && c.Hugepages != "on" && c.Hugepages != "off":
		return badValue("hugepages", c.Hugepages, "must be auto, on or off")
	case c.MaxFrame < minFrame || c.MaxFrame > maxFrame:
		return badValue("max_frame", c.MaxFrame.String(), fmt.Sprintf("must be between %s and %s", Size(minFrame), Size(maxFrame)))
	case c.DataWorkers < 0 || c.DataWorkers > reactor.MaxWorkers:
		return badValue("data_workers", strconv.Itoa(c.DataWorkers), fmt.Sprintf("must be 0 (one per CPU) or 1..%d", reactor.MaxWorkers))
	case c.DataDoorbell != "auto" && c.DataDoorbell != reactor.DoorbellFutex && c.DataDoorbell != reactor.DoorbellEventfd:
		return badValue("data_doorbell", c.DataDoorbell, "must be auto, futex or eventfd")
	case c.DataPoll < 0 || time.Duration(c.DataPoll) > reactor.MaxPoll:
		return badValue("data_poll", c.DataPoll.String(), fmt.Sprintf("must be 0 (never) up to %v", reactor.MaxPoll))
	case c.MaxConns < 1 || c.MaxConns > maxConns:
		return badValue("max_conns", strconv.Itoa(c.MaxConns), fmt.Sprintf("must be between 1 and %d", maxConns))
	case c.MaxBufferSize < 4096:
		return badValue("max_buffer_size", c.MaxBufferSize.String(), "must be at least 4KiB")
	case c.DrainTimeout <= 0 || time.Duration(c.DrainTimeout) > maxDrain:
		return badValue("drain_timeout", c.DrainTimeout.String(), "must be positive and at most 10m")
	case c.LogFormat != "text" && c.LogFormat != "json":
		return badValue("log_format", c.LogFormat, "must be text or json")
	}
	if _, err := ParseLevel(c.LogLevel); err != nil {
		return badValue("log_level", c.LogLevel, "must be debug, info, warn or error")
	}
	for _, p := range c.AllowedFiles {
		if !filepath.IsAbs(p) {
			return badValue("allowed_files", p, "must be an absolute path")
		}
	}
	if err := c.validateOps(); err != nil {
		return err
	}
	if err := c.validatePeers(); err != nil {
		return err
	}
	if err := c.validateAccess(); err != nil {
		return err
	}
	if err := c.validateStore(); err != nil {
		return err
	}
	return c.validateDirectory()
}

// validatePeers checks the peer plane's keys.
func (c *Config) validatePeers() error {
	if err := checkDaemonID("daemon_id", c.DaemonID); err != nil {
		return err
	}
	if c.PeerListen != "" {
		if err := checkHostPort("peer_listen", c.PeerListen); err != nil {
			return err
		}
		if c.ClusterKeyFile == "" {
			return badValue("cluster_key_file", "", "required when peer_listen is set")
		}
	}
	if c.PeerAdvertise != "" {
		if err := checkHostPort("peer_advertise", c.PeerAdvertise); err != nil {
			return err
		}
	}
	if c.ClusterKeyFile != "" && !filepath.IsAbs(c.ClusterKeyFile) {
		return badValue("cluster_key_file", c.ClusterKeyFile, "must be an absolute path")
	}
	if c.PeerConns < 1 || c.PeerConns > 64 {
		return badValue("peer_conns", strconv.Itoa(c.PeerConns), "must be between 1 and 64")
	}
	if c.PeerSliceSize < 4<<10 || c.PeerSliceSize > 64<<20 {
		return badValue("peer_slice_size", c.PeerSliceSize.String(), "must be between 4KiB and 64MiB")
	}
	if c.RDMAInlineRead > c.PeerSliceSize {
		return badValue("rdma_inline_read", c.RDMAInlineRead.String(), fmt.Sprintf("must be at most peer_slice_size (%s); 0 reads every value by rdma", c.PeerSliceSize))
	}
	if c.RDMA != "auto" && c.RDMA != "on" && c.RDMA != "off" {
		return badValue("rdma", c.RDMA, "must be auto, on or off")
	}
	if c.RDMA == "on" && c.PeerListen == "" {
		return badValue("rdma", c.RDMA, "needs peer_listen (RDMA set-up travels over the peer channel)")
	}
	if len(c.RDMADevice) > 64 || strings.ContainsAny(c.RDMADevice, "/ \t\n") {
		return badValue("rdma_device", c.RDMADevice, "must be a device name (e.g. mlx5_0, rxe0)")
	}
	if len(c.RDMAGID) > 64 {
		return badValue("rdma_gid", c.RDMAGID, "must be a GID index or an address")
	}
	if c.RDMAQPs < 1 || c.RDMAQPs > 64 {
		return badValue("rdma_qps", strconv.Itoa(c.RDMAQPs), "must be between 1 and 64")
	}
	seen := map[string]bool{c.DaemonID: true}
	for _, p := range c.Peers {
		if err := checkDaemonID("peers.id", p.ID); err != nil {
			return err
		}
		if seen[p.ID] {
			return badValue("peers.id", p.ID, "appears twice or names this daemon")
		}
		seen[p.ID] = true
		if p.Addr == "" {
			continue // accepted when it dials in; see Config.Peers
		}
		if err := checkHostPort("peers.addr", p.Addr); err != nil {
			return err
		}
	}
	return nil
}

func checkDaemonID(key, id string) error {
	if id == "" || len(id) > 64 || strings.ContainsAny(id, "/ \t\n") {
		return badValue(key, id, "must be 1..64 bytes without '/' or spaces")
	}
	return nil
}

func checkHostPort(key, v string) error {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return badValue(key, v, "must be host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return badValue(key, v, "port must be 0..65535")
	}
	return nil
}

// parsePeer reads one --peer / TENSORCAST_PEERS entry: id=host:port, or
// id= for a peer accepted when it dials in.
func parsePeer(s string) (PeerConfig, error) {
	id, addr, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok {
		return PeerConfig{}, fmt.Errorf("want id=host:port (or id= for a peer that dials in), got %q", s)
	}
	return PeerConfig{ID: id, Addr: addr}, nil
}

func badValue(key, value, why string) error {
	return &KeyError{Key: key, Value: value, Why: why}
}

// KeyError is an invalid configuration value: which key, the value, and
// why it is refused. It matches ErrConfig.
type KeyError struct {
	Key, Value, Why string
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("%v: %s = %q: %s", ErrConfig, e.Key, e.Value, e.Why)
}

func (e *KeyError) Unwrap() error { return ErrConfig }

// setting is one configuration key: how to read it from a string (env and
// flags) and where it lands.
type setting struct {
	key, env, usage string
	set             func(c *Config, s string) error
}

func settings() []setting {
	str := func(dst func(*Config) *string) func(*Config, string) error {
		return func(c *Config, s string) error { *dst(c) = s; return nil }
	}
	return append([]setting{
		{"socket", "TENSORCAST_SOCKET", "control socket path", str(func(c *Config) *string { return &c.Socket })},
		{"socket_mode", "TENSORCAST_SOCKET_MODE", "control socket mode (octal)", func(c *Config, s string) error { return c.SocketMode.UnmarshalText([]byte(s)) }},
		{"data_dir", "TENSORCAST_DATA_DIR", "state directory", str(func(c *Config) *string { return &c.DataDir })},
		{"pool_size", "TENSORCAST_POOL_SIZE", "DRAM pool size (e.g. 256MiB, 4GiB)", func(c *Config, s string) error { return c.PoolSize.UnmarshalText([]byte(s)) }},
		{"data_workers", "TENSORCAST_DATA_WORKERS", "reactor workers serving the queues, each with its io_uring ring (0: one per CPU)", func(c *Config, s string) error {
			n, err := strconv.Atoi(s)
			c.DataWorkers = n
			return err
		}},
		{"data_doorbell", "TENSORCAST_DATA_DOORBELL", "how clients wake a sleeping worker: auto, futex, eventfd", str(func(c *Config) *string { return &c.DataDoorbell })},
		{"data_poll", "TENSORCAST_DATA_POLL", "how long a worker looks for a client's next requests before it sleeps (0: never)", func(c *Config, s string) error { return c.DataPoll.UnmarshalText([]byte(s)) }},
		{"hugepages", "TENSORCAST_HUGEPAGES", "hugepages for the pool: auto, on, off", str(func(c *Config) *string { return &c.Hugepages })},
		{"max_frame", "TENSORCAST_MAX_FRAME", "largest control frame", func(c *Config, s string) error { return c.MaxFrame.UnmarshalText([]byte(s)) }},
		{"max_conns", "TENSORCAST_MAX_CONNS", "most client connections", func(c *Config, s string) error {
			n, err := strconv.Atoi(s)
			c.MaxConns = n
			return err
		}},
		{"drain_timeout", "TENSORCAST_DRAIN_TIMEOUT", "bound on the shutdown drain (e.g. 10s)", func(c *Config, s string) error { return c.DrainTimeout.UnmarshalText([]byte(s)) }},
		{"log_format", "TENSORCAST_LOG_FORMAT", "log format: text or json", str(func(c *Config) *string { return &c.LogFormat })},
		{"log_level", "TENSORCAST_LOG_LEVEL", "log level: debug, info, warn, error", str(func(c *Config) *string { return &c.LogLevel })},
		{"daemon_id", "TENSORCAST_DAEMON_ID", "this daemon's id among its peers (default: hostname)", str(func(c *Config) *string { return &c.DaemonID })},
		{"peer_listen", "TENSORCAST_PEER_LISTEN", "host:port of the peer data plane (empty: none)", str(func(c *Config) *string { return &c.PeerListen })},
		{"peer_advertise", "TENSORCAST_PEER_ADVERTISE", "address peers dial (default: the listen address)", str(func(c *Config) *string { return &c.PeerAdvertise })},
		{"cluster_key_file", "TENSORCAST_CLUSTER_KEY_FILE", "cluster key file (mode 0600), required with peer_listen", str(func(c *Config) *string { return &c.ClusterKeyFile })},
		{"peer_conns", "TENSORCAST_PEER_CONNS", "connections per peer", func(c *Config, s string) error {
			n, err := strconv.Atoi(s)
			c.PeerConns = n
			return err
		}},
		{"peer_slice_size", "TENSORCAST_PEER_SLICE_SIZE", "largest payload of one peer frame", func(c *Config, s string) error { return c.PeerSliceSize.UnmarshalText([]byte(s)) }},
		{"rdma", "TENSORCAST_RDMA", "RDMA between daemons: auto, on, off", str(func(c *Config) *string { return &c.RDMA })},
		{"rdma_device", "TENSORCAST_RDMA_DEVICE", "RDMA device (default: the first with an active port)", str(func(c *Config) *string { return &c.RDMADevice })},
		{"rdma_gid", "TENSORCAST_RDMA_GID", "RoCE v2 GID index or address (default: automatic)", str(func(c *Config) *string { return &c.RDMAGID })},
		{"rdma_qps", "TENSORCAST_RDMA_QPS", "RC queue pairs per peer link", func(c *Config, s string) error {
			n, err := strconv.Atoi(s)
			c.RDMAQPs = n
			return err
		}},
		{"rdma_inline_read", "TENSORCAST_RDMA_INLINE_READ", "largest value a remote get of one key reads from an rdma-linked holder in one peer exchange (0: all by rdma)", func(c *Config, s string) error { return c.RDMAInlineRead.UnmarshalText([]byte(s)) }},
		{"metrics_address", "TENSORCAST_METRICS_ADDRESS", `Prometheus endpoint host:port, or "off"`, str(func(c *Config) *string { return &c.MetricsAddress })},
		{"ebpf", "TENSORCAST_EBPF", "kernel-side eBPF views: auto, on, off", str(func(c *Config) *string { return &c.EBPF })},
		{"ebpf_uring_sample", "TENSORCAST_EBPF_URING_SAMPLE", "the io_uring view times one request in N (1: all)", func(c *Config, s string) error {
			n, err := strconv.Atoi(s)
			c.EBPFUringSample = n
			return err
		}},
		{"peers", "TENSORCAST_PEERS", "peers as id=host:port (id= for one that dials in), comma-separated (flag: repeatable --peer)", func(c *Config, s string) error {
			c.Peers = c.Peers[:0]
			for _, e := range strings.Split(s, ",") {
				if strings.TrimSpace(e) == "" {
					continue
				}
				p, err := parsePeer(e)
				if err != nil {
					return err
				}
				c.Peers = append(c.Peers, p)
			}
			return nil
		}},
	}, slices.Concat(metricsSettings(), directorySettings(), accessSettings(), storeSettings())...)
}

// Load builds the configuration from defaults, the file named by --config
// (or TENSORCAST_CONFIG), the environment and the flags in args.
func Load(args []string, getenv func(string) string) (Config, error) {
	c := Defaults()
	fs := flag.NewFlagSet("tensorcastd", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	configPath := fs.String("config", getenv("TENSORCAST_CONFIG"), "TOML config file (env TENSORCAST_CONFIG)")
	flagVals := map[string]*string{}
	sets := settings()
	for _, s := range sets {
		if s.key == "peers" {
			continue // the repeatable --peer below
		}
		flagVals[s.key] = fs.String(strings.ReplaceAll(s.key, "_", "-"), "", s.usage+" (env "+s.env+")")
	}
	var flagPeers []string
	fs.Func("peer", "a peer daemon as id=host:port; repeat for more (env TENSORCAST_PEERS, comma-separated)", func(v string) error {
		flagPeers = append(flagPeers, v)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected argument %q", ErrConfig, fs.Arg(0))
	}
	if *configPath != "" {
		if err := loadFile(&c, *configPath); err != nil {
			return c, err
		}
	}
	for _, s := range sets {
		if v := getenv(s.env); v != "" {
			if err := s.set(&c, v); err != nil {
				return c, badValue(s.key, v, "from "+s.env+": "+err.Error())
			}
		}
	}
	var ferr error
	fs.Visit(func(f *flag.Flag) {
		key := strings.ReplaceAll(f.Name, "-", "_")
		for _, s := range sets {
			if s.key == key && ferr == nil {
				if err := s.set(&c, *flagVals[key]); err != nil {
					ferr = badValue(key, *flagVals[key], "from --"+f.Name+": "+err.Error())
				}
			}
		}
	})
	if ferr != nil {
		return c, ferr
	}
	if len(flagPeers) > 0 {
		c.Peers = nil
		for _, v := range flagPeers {
			p, err := parsePeer(v)
			if err != nil {
				return c, badValue("peers", v, "from --peer: "+err.Error())
			}
			c.Peers = append(c.Peers, p)
		}
	}
	return c, c.Validate()
}

func loadFile(c *Config, path string) error {
	md, err := toml.DecodeFile(path, c)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return fmt.Errorf("%w: %s: unknown key %q", ErrConfig, path, und[0].String())
	}
	return nil
}

// Size is a byte count written with an optional binary suffix: 4096, 64k,
// 64KiB, 256m, 256MiB, 4g, 4GiB, 1t. Suffixes are powers of 1024.
type Size uint64

// UnmarshalText parses a size.
func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = Size(v)
	return nil
}

// String renders the size with the largest exact binary suffix.
func (s Size) String() string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v, i := uint64(s), 0
	for v >= 1024 && v%1024 == 0 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return strconv.FormatUint(v, 10) + units[i]
}

// ParseSize reads a byte count with an optional binary suffix.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	lower := strings.ToLower(t)
	mult := uint64(1)
	for _, u := range []struct {
		suffix string
		mult   uint64
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40}, {"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, {"b", 1}} {
		if strings.HasSuffix(lower, u.suffix) {
			lower, mult = strings.TrimSuffix(lower, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(lower), 10, 64)
	if err != nil || lower == "" {
		return 0, fmt.Errorf("not a size: %q", s)
	}
	if n > (1<<63)/mult {
		return 0, fmt.Errorf("size out of range: %q", s)
	}
	return n * mult, nil
}

// Duration is a time.Duration written as "10s", "1m30s".
type Duration time.Duration

// UnmarshalText parses a duration.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("not a duration: %q", b)
	}
	*d = Duration(v)
	return nil
}

func (d Duration) String() string { return time.Duration(d).String() }

// FileMode is permission bits written in octal ("0660").
type FileMode uint32

// UnmarshalText parses octal permission bits.
func (m *FileMode) UnmarshalText(b []byte) error {
	v, err := strconv.ParseUint(string(b), 8, 32)
	if err != nil {
		return fmt.Errorf("not an octal mode: %q", b)
	}
	*m = FileMode(v)
	return nil
}

// hostID is the default daemon_id: the host's name.
func hostID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "tensorcastd"
	}
	return h
}

// ParseLevel parses a log_level value.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("bad log level %q", s)
	}
	return l, nil
}
