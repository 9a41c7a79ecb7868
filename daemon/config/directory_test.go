package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDirectoryConfig: the embedded directory is the default and needs
// nothing; etcd is chosen and set from the file, the environment and
// flags in the usual precedence.
func TestDirectoryConfig(t *testing.T) {
	c, err := Load(nil, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Directory != "embedded" || time.Duration(c.StalenessBudget) != 2*time.Second || c.EtcdPrefix != "/tensorcast/" {
		t.Fatalf("defaults: %+v", c.DirectoryConfig)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "tc.toml")
	writeFile(t, file, `
peer_listen = "127.0.0.1:0"
cluster_key_file = "/etc/tensorcast/cluster.key"
directory = "etcd"
etcd_endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
etcd_prefix = "/tc/prod/"
staleness_budget = "500ms"
etcd_lease_ttl = "5s"
`)
	c, err = Load([]string{"--config", file}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Directory != "etcd" || len(c.EtcdEndpoints) != 2 || c.EtcdPrefix != "/tc/prod/" ||
		time.Duration(c.StalenessBudget) != 500*time.Millisecond || time.Duration(c.EtcdLeaseTTL) != 5*time.Second {
		t.Fatalf("file: %+v", c.DirectoryConfig)
	}
	c, err = Load([]string{"--config", file, "--staleness-budget", "3s"},
		env(map[string]string{"TENSORCAST_ETCD_ENDPOINTS": "http://127.0.0.1:2379", "TENSORCAST_STALENESS_BUDGET": "1s"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.EtcdEndpoints) != 1 || c.EtcdEndpoints[0] != "http://127.0.0.1:2379" || time.Duration(c.StalenessBudget) != 3*time.Second {
		t.Fatalf("env and flags: %+v", c.DirectoryConfig)
	}
}

func TestDirectoryConfigInvalid(t *testing.T) {
	peer := map[string]string{"TENSORCAST_PEER_LISTEN": "127.0.0.1:0", "TENSORCAST_CLUSTER_KEY_FILE": "/k", "TENSORCAST_DIRECTORY": "etcd"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range peer {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"unknown backend", []string{"--directory", "zookeeper"}, nil, []string{"directory", "zookeeper"}},
		{"etcd without peer plane", []string{"--directory", "etcd"}, nil, []string{"directory", "peer_listen"}},
		{"bad endpoint", nil, with("TENSORCAST_ETCD_ENDPOINTS", "127.0.0.1:2379"), []string{"etcd_endpoints", "127.0.0.1:2379"}},
		{"https without CA", nil, with("TENSORCAST_ETCD_ENDPOINTS", "https://e:2379"), []string{"etcd_ca_file", "https://e:2379"}},
		{"http with TLS files", nil, with("TENSORCAST_ETCD_CA_FILE", "/ca.pem"), []string{"etcd_endpoints", "TLS"}},
		{"cert without key", nil, with("TENSORCAST_ETCD_ENDPOINTS", "https://e:2379", "TENSORCAST_ETCD_CA_FILE", "/ca.pem", "TENSORCAST_ETCD_CERT_FILE", "/c.pem"), []string{"etcd_cert_file", "/c.pem"}},
		{"relative CA", nil, with("TENSORCAST_ETCD_ENDPOINTS", "https://e:2379", "TENSORCAST_ETCD_CA_FILE", "ca.pem"), []string{"etcd_ca_file", "ca.pem"}},
		{"bad prefix", []string{"--etcd-prefix", "tensorcast"}, with(), []string{"etcd_prefix", "tensorcast"}},
		{"fractional lease", []string{"--etcd-lease-ttl", "1500ms"}, with(), []string{"etcd_lease_ttl", "1.5s"}},
		{"bad lease", []string{"--etcd-lease-ttl", "forever"}, with(), []string{"etcd_lease_ttl", "forever"}},
		{"budget too small", nil, with("TENSORCAST_STALENESS_BUDGET", "1ms"), []string{"staleness_budget", "1ms"}},
	}
	for _, tc := range cases {
		_, err := Load(tc.args, env(tc.env))
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %q", tc.name, err, w)
			}
		}
	}
}
