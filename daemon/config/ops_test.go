package config

import (
	"path/filepath"
	"testing"
	"time"
)

func TestMetricsConfig(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "good.toml")
	writeFile(t, p, `
metrics_max_conns = 8
metrics_header_timeout = "2s"
metrics_idle_timeout = "1m"
metrics_snapshot_interval = "500ms"
`)
	c, err := Load([]string{"--config", p, "--metrics-reserved-fds", "300"}, env(map[string]string{"TENSORCAST_METRICS_MAX_CONNS": "9"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.MetricsMaxConns != 9 || time.Duration(c.MetricsHeaderTimeout) != 2*time.Second || time.Duration(c.MetricsIdleTimeout) != time.Minute ||
		time.Duration(c.MetricsSnapshotInterval) != 500*time.Millisecond || c.MetricsReserve(1024) != 300 {
		t.Fatalf("loaded %+v", c.MetricsConfig)
	}
	d := Defaults()
	if got := d.MetricsReserve(1024); got != d.MaxConns+64 {
		t.Fatalf("default reserve at 1024 descriptors: %d, want max_conns + 64 = %d", got, d.MaxConns+64)
	}
	if got := d.MetricsReserve(256); got != 128 {
		t.Fatalf("default reserve at 256 descriptors: %d, want half", got)
	}
	refused(t, dir, []badFile{
		{"no conns", "metrics_max_conns = 0\n", []string{"metrics_max_conns", "0"}},
		{"many conns", "metrics_max_conns = 5000\n", []string{"metrics_max_conns", "5000"}},
		{"header", "metrics_header_timeout = \"2m\"\n", []string{"metrics_header_timeout", "2m"}},
		{"idle", "metrics_idle_timeout = \"1ms\"\n", []string{"metrics_idle_timeout", "1ms"}},
		{"snapshot", "metrics_snapshot_interval = \"0s\"\n", []string{"metrics_snapshot_interval", "0s"}},
		{"reserve", "metrics_reserved_fds = -1\n", []string{"metrics_reserved_fds", "-1"}},
	})
}
