package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestDefaultsAreValid(t *testing.T) {
	c, err := Load(nil, env(nil))
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.Socket != "/run/tensorcast/tensorcastd.sock" {
		t.Fatalf("socket default = %q", c.Socket)
	}
}

func TestPrecedenceFileEnvFlag(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tc.toml")
	writeFile(t, file, `
socket = "/tmp/file.sock"
pool_size = "64MiB"
data_dir = "/tmp/file-data"
drain_timeout = "3s"
socket_mode = "0600"
allowed_uids = [1000, 0]
`)
	c, err := Load([]string{"--config", file}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/tmp/file.sock" || c.PoolSize != 64<<20 || c.DataDir != "/tmp/file-data" ||
		time.Duration(c.DrainTimeout) != 3*time.Second || c.SocketMode != 0o600 || len(c.AllowedUIDs) != 2 {
		t.Fatalf("file values not applied: %+v", c)
	}
	// env beats file
	c, err = Load([]string{"--config", file}, env(map[string]string{"TENSORCAST_SOCKET": "/tmp/env.sock", "TENSORCAST_POOL_SIZE": "32m"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/tmp/env.sock" || c.PoolSize != 32<<20 || c.DataDir != "/tmp/file-data" {
		t.Fatalf("env did not override file: %+v", c)
	}
	// flags beat env; TENSORCAST_CONFIG names the file
	c, err = Load([]string{"--socket", "/tmp/flag.sock", "--pool-size", "16MiB", "--data-dir", "/tmp/flag-data"},
		env(map[string]string{"TENSORCAST_CONFIG": file, "TENSORCAST_SOCKET": "/tmp/env.sock"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/tmp/flag.sock" || c.PoolSize != 16<<20 || c.DataDir != "/tmp/flag-data" || c.SocketMode != 0o600 {
		t.Fatalf("flags did not override env/file: %+v", c)
	}
}

func TestInvalidValuesNameKeyAndValue(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		args []string
		env  map[string]string
		file string
		want []string // substrings of the error
	}{
		{name: "bad size flag", args: []string{"--pool-size", "12XB"}, want: []string{"pool_size", "12XB"}},
		{name: "pool too small", args: []string{"--pool-size", "1k"}, want: []string{"pool_size", "1KiB"}},
		{name: "bad env size", env: map[string]string{"TENSORCAST_POOL_SIZE": "lots"}, want: []string{"pool_size", "lots", "TENSORCAST_POOL_SIZE"}},
		{name: "empty socket", args: []string{"--socket", ""}, want: []string{"socket"}},
		{name: "bad hugepages", args: []string{"--hugepages", "maybe"}, want: []string{"hugepages", "maybe"}},
		{name: "bad mode", env: map[string]string{"TENSORCAST_SOCKET_MODE": "0999"}, want: []string{"socket_mode", "0999"}},
		{name: "mode without owner rw", env: map[string]string{"TENSORCAST_SOCKET_MODE": "0400"}, want: []string{"socket_mode", "0400"}},
		{name: "bad duration", args: []string{"--drain-timeout", "soon"}, want: []string{"drain_timeout", "soon"}},
		{name: "negative drain", args: []string{"--drain-timeout", "-1s"}, want: []string{"drain_timeout", "-1s"}},
		{name: "bad conns", args: []string{"--max-conns", "0"}, want: []string{"max_conns", "0"}},
		{name: "negative workers", args: []string{"--data-workers", "-1"}, want: []string{"data_workers", "-1"}},
		{name: "too many workers", env: map[string]string{"TENSORCAST_DATA_WORKERS": "257"}, want: []string{"data_workers", "257"}},
		{name: "workers not a number", file: "data_workers = \"all\"\n", want: []string{"data_workers"}},
		{name: "bad doorbell", args: []string{"--data-doorbell", "bell"}, want: []string{"data_doorbell", "bell"}},
		{name: "poll too long", args: []string{"--data-poll", "2ms"}, want: []string{"data_poll", "2ms"}},
		{name: "negative poll", env: map[string]string{"TENSORCAST_DATA_POLL": "-1us"}, want: []string{"data_poll", "-1µs"}},
		{name: "poll not a duration", file: "data_poll = 50\n", want: []string{"data_poll"}},
		{name: "bad log level", args: []string{"--log-level", "loud"}, want: []string{"log_level", "loud"}},
		{name: "unknown flag", args: []string{"--pool", "1g"}, want: []string{"pool"}},
		{name: "stray argument", args: []string{"extra"}, want: []string{"extra"}},
		{name: "unknown file key", file: "pool = \"1g\"\n", want: []string{"unknown key", "pool"}},
		{name: "bad file size", file: "pool_size = \"huge\"\n", want: []string{"pool_size", "huge"}},
		{name: "relative allowed file", file: "allowed_files = [\"data\"]\n", want: []string{"allowed_files", "data"}},
		{name: "relative data_dir flag", args: []string{"--data-dir", "data"}, want: []string{"data_dir", `"data"`, "absolute"}},
		{name: "relative data_dir env", env: map[string]string{"TENSORCAST_DATA_DIR": "./var/tc"}, want: []string{"data_dir", "./var/tc", "absolute"}},
		{name: "relative data_dir file", file: "data_dir = \"state\"\n", want: []string{"data_dir", "state", "absolute"}},
		{name: "relative socket", args: []string{"--socket", "run/tc.sock"}, want: []string{"socket", "run/tc.sock", "absolute"}},
		{name: "relative socket file", file: "socket = \"tc.sock\"\n", want: []string{"socket", "tc.sock", "absolute"}},
		{name: "socket path too long", args: []string{"--socket", "/" + strings.Repeat("s", 120)}, want: []string{"socket", "107"}},
		{name: "missing file", args: []string{"--config", "/nonexistent/tc.toml"}, want: []string{"/nonexistent/tc.toml"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".toml")
				writeFile(t, p, tc.file)
				args = append([]string{"--config", p}, args...)
			}
			_, err := Load(args, env(tc.env))
			if err == nil {
				t.Fatalf("accepted %v %v", args, tc.env)
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("error %v is not ErrConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	good := map[string]uint64{"4096": 4096, "64k": 64 << 10, "64KiB": 64 << 10, "256m": 256 << 20, "2GiB": 2 << 30, "1t": 1 << 40, "10B": 10, " 8 MiB ": 8 << 20}
	for in, want := range good {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "k", "-1", "1.5g", "12XB", "99999999999999999999", "9000000000t"} {
		if v, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want error", in, v)
		}
	}
	if s := Size(3 << 30).String(); s != "3GiB" {
		t.Errorf("Size string = %s", s)
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestShippedExampleConfigLoads(t *testing.T) {
	c, err := Load([]string{"--config", "../../deploy/tensorcastd.toml"}, env(nil))
	if err != nil {
		t.Fatalf("deploy/tensorcastd.toml: %v", err)
	}
	if c.PoolSize != 4<<30 || c.LogFormat != "json" {
		t.Fatalf("example config not read: %+v", c)
	}
}

func TestPeerKeys(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tc.toml")
	writeFile(t, file, `
daemon_id = "prefill-1"
peer_listen = "127.0.0.1:7400"
peer_advertise = "10.0.0.1:7400"
cluster_key_file = "/etc/tensorcast/cluster.key"
peer_conns = 8
peer_slice_size = "256KiB"
rdma_qps = 4
rdma_inline_read = "0"

[[peers]]
id = "decode-1"
addr = "10.0.0.2:7400"

[[peers]]
id = "decode-2"
addr = "10.0.0.3:7400"
`)
	c, err := Load([]string{"--config", file}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []PeerConfig{{"decode-1", "10.0.0.2:7400"}, {"decode-2", "10.0.0.3:7400"}}
	if c.DaemonID != "prefill-1" || c.PeerListen != "127.0.0.1:7400" || c.PeerAdvertise != "10.0.0.1:7400" ||
		c.ClusterKeyFile != "/etc/tensorcast/cluster.key" || c.PeerConns != 8 || c.PeerSliceSize != 256<<10 || c.RDMAQPs != 4 || c.RDMAInlineRead != 0 ||
		len(c.Peers) != 2 || c.Peers[0] != want[0] || c.Peers[1] != want[1] {
		t.Fatalf("file values not applied: %+v", c)
	}
	// env replaces the file's peers; repeated --peer flags replace both.
	c, err = Load([]string{"--config", file}, env(map[string]string{"TENSORCAST_PEERS": "a=127.0.0.1:1,b=127.0.0.1:2"}))
	if err != nil || len(c.Peers) != 2 || c.Peers[1] != (PeerConfig{"b", "127.0.0.1:2"}) {
		t.Fatalf("TENSORCAST_PEERS: %v %+v", err, c.Peers)
	}
	c, err = Load([]string{"--config", file, "--peer", "x=127.0.0.1:9", "--peer", "y=[::1]:10", "--daemon-id", "me",
		"--peer-listen", "0.0.0.0:7401", "--cluster-key-file", "/k"},
		env(map[string]string{"TENSORCAST_PEERS": "a=127.0.0.1:1"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Peers) != 2 || c.Peers[0] != (PeerConfig{"x", "127.0.0.1:9"}) || c.Peers[1] != (PeerConfig{"y", "[::1]:10"}) ||
		c.DaemonID != "me" || c.PeerListen != "0.0.0.0:7401" || c.ClusterKeyFile != "/k" {
		t.Fatalf("flags not applied: %+v", c)
	}
	// Defaults: no peer plane, the hostname as id, 4 connections, 1 MiB
	// slices, values up to 32 KiB read from rdma holders in one exchange.
	d := Defaults()
	if d.PeerListen != "" || d.DaemonID == "" || d.PeerConns != 4 || d.PeerSliceSize != 1<<20 || d.RDMAQPs != 2 || d.RDMAInlineRead != 32<<10 {
		t.Fatalf("peer defaults: %+v", d)
	}
}

func TestPeerKeysValidation(t *testing.T) {
	ok := func() Config {
		c := Defaults()
		c.DaemonID = "d1"
		c.PeerListen = "127.0.0.1:0"
		c.ClusterKeyFile = "/etc/tensorcast/cluster.key"
		c.Peers = []PeerConfig{{"d2", "127.0.0.1:7402"}}
		return c
	}
	if c := ok(); c.Validate() != nil {
		t.Fatalf("valid peer config refused: %v", c.Validate())
	}
	for _, tc := range []struct {
		key, value string
		mut        func(*Config)
	}{
		{"cluster_key_file", `""`, func(c *Config) { c.ClusterKeyFile = "" }},
		{"cluster_key_file", "relative.key", func(c *Config) { c.ClusterKeyFile = "relative.key" }},
		{"peer_listen", "nohostport", func(c *Config) { c.PeerListen = "nohostport" }},
		{"peer_listen", "127.0.0.1:70000", func(c *Config) { c.PeerListen = "127.0.0.1:70000" }},
		{"peer_advertise", "x", func(c *Config) { c.PeerAdvertise = "x" }},
		{"daemon_id", `""`, func(c *Config) { c.DaemonID = "" }},
		{"daemon_id", "a/b", func(c *Config) { c.DaemonID = "a/b" }},
		{"daemon_id", strings.Repeat("x", 65), func(c *Config) { c.DaemonID = strings.Repeat("x", 65) }},
		{"peer_conns", "0", func(c *Config) { c.PeerConns = 0 }},
		{"peer_conns", "65", func(c *Config) { c.PeerConns = 65 }},
		{"rdma_qps", "0", func(c *Config) { c.RDMAQPs = 0 }},
		{"rdma_qps", "65", func(c *Config) { c.RDMAQPs = 65 }},
		{"peer_slice_size", "1KiB", func(c *Config) { c.PeerSliceSize = 1 << 10 }},
		{"peer_slice_size", "128MiB", func(c *Config) { c.PeerSliceSize = 128 << 20 }},
		{"rdma_inline_read", "2MiB", func(c *Config) { c.RDMAInlineRead = 2 << 20 }},
		{"rdma_inline_read", "32KiB", func(c *Config) { c.PeerSliceSize = 16 << 10 }},
		{"peers.id", "d2", func(c *Config) { c.Peers = append(c.Peers, PeerConfig{"d2", "127.0.0.1:1"}) }},
		{"peers.id", "d1", func(c *Config) { c.Peers = []PeerConfig{{"d1", "127.0.0.1:1"}} }},
		{"peers.id", `""`, func(c *Config) { c.Peers = []PeerConfig{{"", "127.0.0.1:1"}} }},
		{"peers.addr", "nowhere", func(c *Config) { c.Peers = []PeerConfig{{"d3", "nowhere"}} }},
	} {
		c := ok()
		tc.mut(&c)
		err := c.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.key+" = ") ||
			(tc.value != `""` && !strings.Contains(err.Error(), tc.value)) {
			t.Errorf("%s = %s: got %v, want ErrConfig naming the key and value", tc.key, tc.value, err)
		}
	}
	// A --peer without '=' names the key and the value.
	_, err := Load([]string{"--peer", "d2-127.0.0.1:1"}, env(nil))
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "peers") || !strings.Contains(err.Error(), "d2-127.0.0.1:1") {
		t.Fatalf("bad --peer: %v", err)
	}
	// An unknown key in a [[peers]] table is refused.
	file := filepath.Join(t.TempDir(), "tc.toml")
	writeFile(t, file, "[[peers]]\nid = \"d2\"\nadress = \"127.0.0.1:1\"\n")
	if _, err := Load([]string{"--config", file}, env(nil)); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "adress") {
		t.Fatalf("misspelt peers key: %v", err)
	}
}

// TestDurationsAreGoDurations: drain_timeout (as every duration key, all
// of type Duration) takes any Go duration, from the file, the environment
// and a flag alike, and a value without a unit or with one Go does not
// know is refused naming the key.
func TestDurationsAreGoDurations(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"1m30s", 90 * time.Second},
		{"500ms", 500 * time.Millisecond},
		{"1.5s", 1500 * time.Millisecond},
		{"90000000us", 90 * time.Second},
		{"90000000µs", 90 * time.Second},
		{"1m0.25s", 60250 * time.Millisecond},
		{".5m", 30 * time.Second},
		{"2s500ms", 2500 * time.Millisecond},
		{"1h", time.Hour}, // past the 10m bound: refused by Validate, read all the same
	} {
		file := filepath.Join(dir, "d.toml")
		writeFile(t, file, "drain_timeout = \""+tc.in+"\"\n")
		for name, load := range map[string]func() (Config, error){
			"file": func() (Config, error) { return Load([]string{"--config", file}, env(nil)) },
			"env":  func() (Config, error) { return Load(nil, env(map[string]string{"TENSORCAST_DRAIN_TIMEOUT": tc.in})) },
			"flag": func() (Config, error) { return Load([]string{"--drain-timeout", tc.in}, env(nil)) },
		} {
			c, err := load()
			if tc.want > maxDrain {
				if err == nil || !strings.Contains(err.Error(), "drain_timeout") || !strings.Contains(err.Error(), "at most 10m") {
					t.Errorf("%s %q: %v, want refused as past 10m", name, tc.in, err)
				}
				continue
			}
			if err != nil || time.Duration(c.DrainTimeout) != tc.want {
				t.Errorf("%s %q: %v, %v; want %v", name, tc.in, time.Duration(c.DrainTimeout), err, tc.want)
			}
		}
	}
	for _, bad := range []string{"10", "10 s", "1d", "s", "1.2.3s", ""} {
		_, err := Load([]string{"--drain-timeout", bad}, env(nil))
		if err == nil || !strings.Contains(err.Error(), "drain_timeout") {
			t.Errorf("drain_timeout %q: %v, want refused naming the key", bad, err)
		}
	}
	// A number without quotes in the file is no duration either.
	file := filepath.Join(dir, "n.toml")
	writeFile(t, file, "drain_timeout = 10\n")
	if _, err := Load([]string{"--config", file}, env(nil)); err == nil || !strings.Contains(err.Error(), "drain_timeout") {
		t.Errorf("drain_timeout = 10 in the file: %v, want refused naming the key", err)
	}
}
