package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/wire"
)

func TestWriteCluster(t *testing.T) {
	var b bytes.Buffer
	writeCluster(&b, []wire.Counter{{Name: "uring_rings", Value: 1}})
	if !strings.Contains(b.String(), "this host's alone") {
		t.Fatalf("without cluster counters: %q", b.String())
	}
	b.Reset()
	writeCluster(&b, []wire.Counter{{Name: "cluster_members", Value: 3}, {Name: "cluster_home_shards", Value: 341},
		{Name: "cluster_remote_hits", Value: 24}, {Name: "cluster_remote_bytes", Value: 2 << 20},
		{Name: "cluster_home_lookups", Value: 1}, {Name: "cluster_home_cache_hits", Value: 3}})
	for _, want := range []string{"members:   3 up", "home of:   341 shards", "remote:    24 hits", "2MiB read", "hit rate 75.0%"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
}
