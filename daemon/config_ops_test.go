package daemon

import (
	"errors"
	"strings"
	"testing"
)

func TestOpsKeys(t *testing.T) {
	d := Defaults()
	if d.MetricsAddress != "127.0.0.1:9464" || d.EBPF != "auto" || d.MetricsOff() {
		t.Fatalf("defaults: metrics_address %q ebpf %q", d.MetricsAddress, d.EBPF)
	}
	for _, off := range []string{"off", ""} {
		c := Defaults()
		c.MetricsAddress = off
		if err := c.Validate(); err != nil || !c.MetricsOff() {
			t.Fatalf("metrics_address %q: %v, off %v", off, err, c.MetricsOff())
		}
	}
	c, err := Load([]string{"--metrics-address", "0.0.0.0:9500", "--ebpf", "off"}, env(map[string]string{"TENSORCAST_METRICS_ADDRESS": "127.0.0.1:1"}))
	if err != nil || c.MetricsAddress != "0.0.0.0:9500" || c.EBPF != "off" {
		t.Fatalf("flags: %+v %v", c, err)
	}
	c, err = Load(nil, env(map[string]string{"TENSORCAST_METRICS_ADDRESS": "off", "TENSORCAST_EBPF": "on"}))
	if err != nil || !c.MetricsOff() || c.EBPF != "on" {
		t.Fatalf("env: %+v %v", c, err)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--metrics-address", "9464"}, []string{"metrics_address", `"9464"`, "host:port"}},
		{[]string{"--metrics-address", "localhost:99999"}, []string{"metrics_address", "localhost:99999"}},
		{[]string{"--ebpf", "maybe"}, []string{"ebpf", "maybe", "auto, on or off"}},
		{[]string{"--ebpf-uring-sample", "0"}, []string{"ebpf_uring_sample", "1..65536"}},
		{[]string{"--ebpf-uring-sample", "70000"}, []string{"ebpf_uring_sample", "70000"}},
	} {
		_, err := Load(tc.args, env(nil))
		if err == nil || !errors.Is(err, ErrConfig) {
			t.Fatalf("%v accepted: %v", tc.args, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q does not mention %q", tc.args, err, w)
			}
		}
	}
}

// TestMetricsAddressInUse: a metrics address that cannot be bound fails
// start-up naming the key.
func TestMetricsAddressInUse(t *testing.T) {
	a := testConfig(t.TempDir())
	d1, err := New(a, discardLogger(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer d1.closeParts()
	b := testConfig(t.TempDir())
	b.MetricsAddress = d1.MetricsAddr()
	if _, err := New(b, discardLogger(), env(nil)); err == nil || !strings.Contains(err.Error(), "metrics_address") {
		t.Fatalf("second daemon on %s: %v", b.MetricsAddress, err)
	}
}
