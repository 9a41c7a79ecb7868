package daemon

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
		{name: "bad log level", args: []string{"--log-level", "loud"}, want: []string{"log_level", "loud"}},
		{name: "unknown flag", args: []string{"--pool", "1g"}, want: []string{"pool"}},
		{name: "stray argument", args: []string{"extra"}, want: []string{"extra"}},
		{name: "unknown file key", file: "pool = \"1g\"\n", want: []string{"unknown key", "pool"}},
		{name: "bad file size", file: "pool_size = \"huge\"\n", want: []string{"pool_size", "huge"}},
		{name: "relative allowed file", file: "allowed_files = [\"data\"]\n", want: []string{"allowed_files", "data"}},
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
	c, err := Load([]string{"--config", "../deploy/tensorcastd.toml"}, env(nil))
	if err != nil {
		t.Fatalf("deploy/tensorcastd.toml: %v", err)
	}
	if c.PoolSize != 4<<30 || c.LogFormat != "json" {
		t.Fatalf("example config not read: %+v", c)
	}
}
