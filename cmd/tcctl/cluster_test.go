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

func TestWriteLocation(t *testing.T) {
	var b bytes.Buffer
	writeLocation(&b, "k/1", wire.ClusterLocateResponse{Shard: 713, Home: "d2", Generation: 0x1234,
		Holders: []string{"d1", "d3"}, HolderEpochs: []uint64{9, 10}, HolderTiers: []uint8{1, 2},
		HolderSizes: []uint64{4096, 1 << 20}, HolderCRCs: []uint32{0xdeadbeef, 7}})
	for _, want := range []string{"shard:      713", "home:       d2 (generation 0x1234)", "holders:    2", "d1", "dram",
		"nvme", "crc32c 0xdeadbeef"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	writeLocation(&b, "k/2", wire.ClusterLocateResponse{Shard: 1, Home: "d1", Generation: 5})
	if !strings.Contains(b.String(), "holders:    none") {
		t.Errorf("no holders: %q", b.String())
	}
}
