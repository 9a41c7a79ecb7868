package config

import (
	"path/filepath"
	"testing"
)

func TestCheckFile(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, body string
		want       []Problem // Key and Line; Msg checked for non-emptiness
	}{
		{"clean", "pool_size = \"64MiB\"\n", nil},
		{"shipped example", "", nil},
		{"several bad values", `# a comment
socket = "/run/tc.sock"
pool_size = "1k"
hugepages = "maybe"

max_conns = 0
metrics_address = "9464"
ebpf = "sometimes"
`, []Problem{{Key: "pool_size", Line: 3}, {Key: "hugepages", Line: 4}, {Key: "max_conns", Line: 6},
			{Key: "metrics_address", Line: 7}, {Key: "ebpf", Line: 8}}},
		{"unknown key", "socket = \"/run/a.sock\"\npool = \"1g\"\n", []Problem{{Key: "pool", Line: 2}}},
		{"bad size text", "data_dir = \"/x\"\npool_size = \"lots\"\n", []Problem{{Key: "pool_size", Line: 2}}},
		{"syntax error", "socket = \"/run/a.sock\"\npool_size = \n", []Problem{{Line: 2}}},
		{"bad peer in a table array", `peer_listen = "127.0.0.1:0"
cluster_key_file = "/etc/key"

[[peers]]
id = "b"
addr = "host-b:7400"

[[peers]]
id = "c"
addr = "no-port"
`, []Problem{{Key: "peers.addr", Line: 10}}},
		{"bad store values, each found", `data_dir = "/srv/tc"
store_l2_path = "/etc/kv.l2"
store_l2_size = "1MiB"
store_max_keys_per_call = 0
`, []Problem{{Key: "store_l2_path", Line: 2}, {Key: "store_l2_size", Line: 3}, {Key: "store_max_keys_per_call", Line: 4}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join("..", "..", "deploy", "tensorcastd.toml")
			if tc.body != "" || tc.want != nil {
				p = filepath.Join(dir, tc.name+".toml")
				writeFile(t, p, tc.body)
			}
			got, err := CheckFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("problems %+v, want %+v", got, tc.want)
			}
			for i, w := range tc.want {
				g := got[i]
				if (w.Key != "" && g.Key != w.Key) || g.Line != w.Line || g.Msg == "" {
					t.Errorf("problem %d = %+v, want key %q line %d", i, g, w.Key, w.Line)
				}
			}
		})
	}
	if _, err := CheckFile(filepath.Join(dir, "absent.toml")); err == nil {
		t.Fatal("a missing file was checked")
	}
}
