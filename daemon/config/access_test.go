package config

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAccessConfig(t *testing.T) {
	dir := t.TempDir()
	good := `
max_conns_per_uid = 8
denied_uids = [0]
frame_timeout = "2s"
accept_stall_timeout = "1m"
[[tenants]]
name = "a"
uids = [1000, 1001]
pool_size = "64MiB"
[[tenants]]
name = "b"
gids = [2000]
allowed_files = ["/mnt/b"]
`
	p := filepath.Join(dir, "good.toml")
	writeFile(t, p, good)
	c, err := Load([]string{"--config", p, "--frame-timeout", "3s"}, env(map[string]string{"TENSORCAST_DENIED_UIDS": "0, 7"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxConnsPerUID != 8 || time.Duration(c.FrameTimeout) != 3*time.Second || time.Duration(c.AcceptStallTimeout) != time.Minute ||
		len(c.DeniedUIDs) != 2 || c.DeniedUIDs[1] != 7 || len(c.Tenants) != 2 {
		t.Fatalf("loaded %+v", c.AccessConfig)
	}
	if c.TenantPoolSize(c.Tenants[0]) != 64<<20 || c.TenantPoolSize(c.Tenants[1]) != c.PoolSize {
		t.Fatalf("tenant pool sizes %v %v", c.TenantPoolSize(c.Tenants[0]), c.TenantPoolSize(c.Tenants[1]))
	}
	if d := Defaults(); len(d.TenantList()) != 1 || d.TenantList()[0].Name != "default" {
		t.Fatalf("default tenants %+v", d.TenantList())
	}

	refused(t, dir, []badFile{
		{"per uid over max", "max_conns = 4\nmax_conns_per_uid = 5\n", []string{"max_conns_per_uid", "5"}},
		{"frame timeout", "frame_timeout = \"1ms\"\n", []string{"frame_timeout", "1ms"}},
		{"stall", "accept_stall_timeout = \"2h\"\n", []string{"accept_stall_timeout", "2h"}},
		{"bad name", "[[tenants]]\nname = \"a/b\"\nuids = [1]\n", []string{"tenants.name", "a/b"}},
		{"twice", "[[tenants]]\nname = \"a\"\nuids = [1]\n[[tenants]]\nname = \"a\"\nuids = [2]\n", []string{"tenants.name", "twice"}},
		{"no users", "[[tenants]]\nname = \"a\"\n", []string{"tenants.uids", "needs"}},
		{"uid in two", "[[tenants]]\nname = \"a\"\nuids = [1]\n[[tenants]]\nname = \"b\"\nuids = [1]\n", []string{"tenants.uids", `"a" and "b"`}},
		{"gid in two", "[[tenants]]\nname = \"a\"\ngids = [9]\n[[tenants]]\nname = \"b\"\ngids = [9]\n", []string{"tenants.gids", "9"}},
		{"allowed with tenants", "allowed_uids = [5]\n[[tenants]]\nname = \"a\"\nuids = [1]\n", []string{"allowed_uids", "[[tenants]]"}},
		{"small pool", "[[tenants]]\nname = \"a\"\nuids = [1]\npool_size = \"1MiB\"\n", []string{"tenants.pool_size", "1MiB"}},
		{"relative file", "[[tenants]]\nname = \"a\"\nuids = [1]\nallowed_files = [\"x\"]\n", []string{"tenants.allowed_files", "x"}},
		{"unknown tenant key", "[[tenants]]\nname = \"a\"\nuids = [1]\nquota = 5\n", []string{"unknown key", "quota"}},
	})
	if _, err := Load(nil, env(map[string]string{"TENSORCAST_DENIED_UIDS": "root"})); err == nil || !strings.Contains(err.Error(), "denied_uids") {
		t.Fatalf("a bad uid list: %v", err)
	}
}

// badFile is a config file Load must refuse with ErrConfig, its error
// naming each of want.
type badFile struct {
	name, file string
	want       []string
}

// refused loads each file (written in dir) and checks it is refused.
func refused(t *testing.T, dir string, files []badFile) {
	t.Helper()
	for _, tc := range files {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".toml")
			writeFile(t, p, tc.file)
			_, err := Load([]string{"--config", p}, env(nil))
			if err == nil || !errors.Is(err, ErrConfig) {
				t.Fatalf("accepted, or not ErrConfig: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
