package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/daemon"
	"github.com/tensorcast/tensorcast/internal/testutil"
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
		{Name: "cluster_home_lookups", Value: 1}, {Name: "cluster_home_cache_hits", Value: 3},
		{Name: "cluster_one_round_trip_reads", Value: 20}, {Name: "cluster_one_round_trip_fallbacks", Value: 2}})
	for _, want := range []string{"members:   3 up", "home of:   341 shards", "remote:    24 hits", "2MiB read", "hit rate 75.0%",
		"one trip:  20 remote gets read in one exchange", "2 begun so and read by a hold"} {
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

// TestWriteShards: the summary counts each home's shards with their
// generations and the shards to move, says which home this daemon is and
// how many shards have none, and lists the claims by holder; the table
// shows this daemon's shards (or every one) with home, generation,
// rendezvous member and keys.
func TestWriteShards(t *testing.T) {
	t1 := client.ShardTable{ShardsTotal: 5, First: 0, HomeIDs: []string{"d1", "d2", "d3"},
		Homes: []uint16{0, 1, 0}, Generations: []uint64{7, 9, 8}, Rendezvous: []uint16{0, 1, 2}, Keys: []uint32{12, 0, 3},
		ClaimHolders: []string{"d2", "d3"}, ClaimCounts: []uint32{3, 1}, ClaimsOutstanding: 4, Holds: 2, Fenced: true}
	t2 := client.ShardTable{ShardsTotal: 5, First: 3, HomeIDs: []string{"d2"},
		Homes: []uint16{wire.NoHome, 0}, Generations: []uint64{0, 9}, Rendezvous: []uint16{0, 0}, Keys: []uint32{0, 0}}
	v := shardView{self: "d1", fenced: true, shards: append(shardRows(t1), shardRows(t2)...),
		claimHolders: t1.ClaimHolders, claimCounts: t1.ClaimCounts, outstanding: 4, holds: 2}
	var b strings.Builder
	writeShardSummary(&b, v)
	for _, want := range []string{"shards:    5, homes and generations (etcd claim)",
		"d1 (this daemon)     home of 2, generations 0x7..0x8, 1 to move to their rendezvous member",
		"d2                   home of 2, generation 0x9\n", "1 shards without a home",
		"by holder: 4 read claims outstanding as home: 3 at d2, 1 at d3; 2 reads held here for other daemons"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	writeShards(&b, v, false)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "SHARD") || strings.Join(strings.Fields(lines[1]), " ") != "0 d1 0x7 d1 12" ||
		strings.Join(strings.Fields(lines[2]), " ") != "2 d1 0x8 d3 3" {
		t.Errorf("this daemon's shards:\n%s", b.String())
	}
	b.Reset()
	writeShards(&b, v, true)
	if !strings.Contains(b.String(), "3       -") || strings.Count(b.String(), "\n") != 7 {
		t.Errorf("every shard:\n%s", b.String())
	}
}

// TestClusterShardsCmd: against a daemon whose one peer is down, tcctl
// cluster says it is home of every shard at its run epoch, with no claims
// outstanding, and tcctl cluster shards lists them all with that
// generation; a daemon without the store across hosts says so.
func TestClusterShardsCmd(t *testing.T) {
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tcctl cluster test key")
	sock := startDirDaemon(t, "host-a", key, func(c *daemon.Config) {
		c.Peers = []daemon.PeerConfig{{ID: "gone-1", Addr: "127.0.0.1:1"}}
		c.StoreShards = 64
	})
	c := dialT(t, sock)
	var tab client.ShardTable
	testutil.Eventually(t, 20*time.Second, func() bool {
		var err error
		tab, err = c.ClusterShards(0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(tab.HomeIDs) == 1 && tab.HomeIDs[0] == "host-a"
	}, "host-a home of every shard (homes %v)", testutil.Lazy(func() []string { return tab.HomeIDs }))
	if tab.ShardsTotal != 64 || len(tab.Homes) != 64 || tab.Fenced || tab.ClaimsOutstanding != 0 || tab.Generations[0] == 0 {
		t.Fatalf("shards: %+v", tab)
	}
	gen := fmt.Sprintf("%#x", tab.Generations[0])
	code, out, errs := tcctl(t, nil, "--socket", sock, "cluster")
	if code != 0 {
		t.Fatalf("cluster: %d %q", code, errs)
	}
	t.Logf("tcctl cluster:\n%s", out)
	for _, want := range []string{"host-a (this daemon)", "home of 64, generation " + gen, "by holder: 0 read claims outstanding as home"} {
		if !strings.Contains(out, want) {
			t.Errorf("tcctl cluster lacks %q:\n%s", want, out)
		}
	}
	code, out, errs = tcctl(t, nil, "--socket", sock, "cluster", "shards")
	if code != 0 {
		t.Fatalf("cluster shards: %d %q", code, errs)
	}
	if n := strings.Count(out, " host-a "); n != 2*64 || !strings.Contains(out, gen) {
		t.Errorf("cluster shards: %d mentions of host-a, want 2 per shard:\n%s", n, out)
	}
	if code, _, _ := tcctl(t, nil, "--socket", sock, "cluster", "shards", "extra"); code != 2 {
		t.Fatalf("cluster shards extra: exit %d", code)
	}
}
