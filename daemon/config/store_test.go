package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStoreConfig: the defaults give a store with an L2 file under
// data_dir; the file, the environment and flags set its keys in the usual
// precedence.
func TestStoreConfig(t *testing.T) {
	c, err := Load([]string{"--data-dir", "/srv/tc"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Store != "on" || c.StoreL2() != "/srv/tc/store.l2" || c.StoreL2Size != 1<<30 || c.StoreL1Capacity != 0 ||
		c.StoreMaxKeysPerCall != 1024 || time.Duration(c.StoreMaxLeaseTTL) != 24*time.Hour {
		t.Fatalf("defaults: %+v", c.StoreConfig)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "tc.toml")
	writeFile(t, file, `
data_dir = "/srv/tc"
allowed_files = ["/mnt/nvme0"]
store_l2_path = "/mnt/nvme0/kv.l2"
store_l2_size = "64GiB"
store_l1_capacity = "128MiB"
store_high_watermark = 0.9
store_low_watermark = 0.5
store_max_keys_per_call = 4096
store_max_session_pinned = "32MiB"
store_max_grant_pinned = "48MiB"
store_writeback_retries = 0
`)
	c, err = Load([]string{"--config", file}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.StoreL2() != "/mnt/nvme0/kv.l2" || c.StoreL2Size != 64<<30 || c.StoreL1Capacity != 128<<20 || c.StoreHighWatermark != 0.9 ||
		c.StoreLowWatermark != 0.5 || c.StoreMaxKeysPerCall != 4096 || c.StoreMaxSessionPinned != 32<<20 || c.StoreMaxGrantPinned != 48<<20 ||
		c.StoreWritebackRetries != 0 {
		t.Fatalf("file: %+v", c.StoreConfig)
	}
	c, err = Load([]string{"--config", file, "--store-l2-path", "off", "--store-max-keys-per-call", "128"},
		env(map[string]string{"TENSORCAST_STORE_L1_CAPACITY": "64MiB", "TENSORCAST_STORE_MAX_KEYS_PER_CALL": "2"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.StoreL2() != "" || c.StoreL1Capacity != 64<<20 || c.StoreMaxKeysPerCall != 128 {
		t.Fatalf("env and flags: %+v", c.StoreConfig)
	}
}

// TestStoreConfigInvalid: every bad store value fails start-up with the
// key and the value in the message.
func TestStoreConfigInvalid(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"store neither on nor off", []string{"--store", "maybe"}, nil, []string{"store", "maybe"}},
		{"relative L2", []string{"--store-l2-path", "kv.l2"}, nil, []string{"store_l2_path", "kv.l2"}},
		{"L2 outside data_dir", []string{"--store-l2-path", "/etc/kv.l2"}, nil, []string{"store_l2_path", "/etc/kv.l2", "allowed_files"}},
		{"L2 beside data_dir", []string{"--data-dir", "/srv/tc", "--store-l2-path", "/srv/tc2/kv.l2"}, nil, []string{"store_l2_path", "/srv/tc2/kv.l2"}},
		{"L2 too small", nil, map[string]string{"TENSORCAST_STORE_L2_SIZE": "1MiB"}, []string{"store_l2_size", "1MiB"}},
		{"L2 size not a size", []string{"--store-l2-size", "big"}, nil, []string{"store_l2_size", "big"}},
		{"L1 over the pool", []string{"--pool-size", "64MiB", "--store-l1-capacity", "1GiB"}, nil, []string{"store_l1_capacity", "1GiB"}},
		{"watermarks crossed", []string{"--store-high-watermark", "0.5", "--store-low-watermark", "0.8"}, nil,
			[]string{"store_low_watermark", "0.8", "0.5"}},
		{"watermark not a number", nil, map[string]string{"TENSORCAST_STORE_HIGH_WATERMARK": "high"}, []string{"store_high_watermark", "high"}},
		{"value over the largest block", []string{"--store-max-value-size", "8MiB"}, nil, []string{"store_max_value_size", "8MiB"}},
		{"pinned under the largest value", []string{"--store-max-session-pinned", "1MiB"}, nil, []string{"store_max_session_pinned", "1MiB"}},
		{"pinned over the L1 capacity", []string{"--store-l1-capacity", "64MiB", "--store-max-session-pinned", "65MiB"}, nil,
			[]string{"store_max_session_pinned", "65MiB", "64MiB"}},
		{"pinned over the default L1 capacity", []string{"--pool-size", "64MiB"}, map[string]string{"TENSORCAST_STORE_MAX_SESSION_PINNED": "60MiB"},
			[]string{"store_max_session_pinned", "60MiB", "48MiB"}},
		{"pinned not a size", nil, map[string]string{"TENSORCAST_STORE_MAX_SESSION_PINNED": "lots"}, []string{"store_max_session_pinned", "lots"}},
		{"grants' pins under the largest value", []string{"--store-max-grant-pinned", "1MiB"}, nil, []string{"store_max_grant_pinned", "1MiB"}},
		{"grants' pins over the L1 capacity", []string{"--store-l1-capacity", "64MiB", "--store-max-grant-pinned", "65MiB"}, nil,
			[]string{"store_max_grant_pinned", "65MiB", "64MiB"}},
		{"grants' pins over the default L1 capacity", []string{"--pool-size", "64MiB"}, map[string]string{"TENSORCAST_STORE_MAX_GRANT_PINNED": "60MiB"},
			[]string{"store_max_grant_pinned", "60MiB", "48MiB"}},
		{"grants' pins not a size", nil, map[string]string{"TENSORCAST_STORE_MAX_GRANT_PINNED": "lots"}, []string{"store_max_grant_pinned", "lots"}},
		{"too many keys per call", []string{"--store-max-keys-per-call", "70000"}, nil, []string{"store_max_keys_per_call", "70000"}},
		{"no keys per call", []string{"--store-max-keys-per-call", "0"}, nil, []string{"store_max_keys_per_call", "0"}},
		{"lease too long", []string{"--store-max-lease-ttl", "1000h"}, nil, []string{"store_max_lease_ttl", "1000h"}},
		{"retries negative", []string{"--store-writeback-retries", "-1"}, nil, []string{"store_writeback_retries", "-1"}},
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

// TestStoreConfigOverATenantsPool: each tenant's store lives in its own
// pool, so store_l1_capacity, store_max_session_reserved and
// store_max_session_pinned and store_max_grant_pinned must fit the
// smallest tenant's pool, not only pool_size: a store whose L1 is larger
// than its pool never reaches its watermark and never evicts, and its puts
// fail once the pool is full; pins bounded past their store's L1 are not
// bounded. Start-up fails naming the key and the tenant.
func TestStoreConfigOverATenantsPool(t *testing.T) {
	for _, key := range []string{"store_l1_capacity", "store_max_session_reserved", "store_max_session_pinned", "store_max_grant_pinned"} {
		file := filepath.Join(t.TempDir(), "tc.toml")
		writeFile(t, file, `
pool_size = "1GiB"
`+key+` = "512MiB"

[[tenants]]
name = "big"
uids = [1000]

[[tenants]]
name = "small"
uids = [1001]
pool_size = "64MiB"
`)
		_, err := Load([]string{"--config", file}, env(nil))
		if err == nil {
			t.Errorf("%s of 512MiB over a tenant's pool of 64MiB: accepted", key)
			continue
		}
		for _, w := range []string{key, "512MiB", `"small"`} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not name %s", err, w)
			}
		}
	}
}
