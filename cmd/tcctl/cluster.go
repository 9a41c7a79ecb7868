package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/wire"
)

// clusterCmd prints the store across hosts as this daemon runs it, from
// its cluster_* counters; `cluster locate KEY` where a key lives.
func clusterCmd(sock string, args []string, w io.Writer) error {
	if len(args) == 2 && args[0] == "locate" {
		return locateCmd(sock, args[1], w)
	}
	all := false
	switch {
	case len(args) == 1 && args[0] == "shards", len(args) == 2 && args[0] == "shards" && args[1] == "--all":
		all = len(args) == 2
	case len(args) > 0:
		return fmt.Errorf("%w: cluster takes no arguments, shards [--all], or locate KEY", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	if len(args) == 0 {
		st, err := c.Stats()
		if err != nil {
			return err
		}
		if !writeCluster(w, st.Transports) {
			return nil
		}
	}
	shards, err := allShards(c)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		writeShardSummary(w, shards)
	} else {
		writeShards(w, shards, all)
	}
	return nil
}

// shardView is every shard as the daemon knows it, the pages of its
// answers put together.
type shardView struct {
	self   string
	fenced bool
	shards []shardRow
	// claims this daemon, as a home, has outstanding, by holder.
	claimHolders []string
	claimCounts  []uint32
	outstanding  uint64
	holds        uint32
}

type shardRow struct {
	shard            uint32
	home, rendezvous string
	gen              uint64
	keys             uint32
}

// allShards asks the daemon for every shard, a page at a time.
func allShards(c *client.Client) (shardView, error) {
	var v shardView
	v.self = c.Hello().DaemonID
	for first := uint32(0); ; {
		t, err := c.ClusterShards(first, 0)
		if err != nil {
			return v, err
		}
		if first == 0 {
			v.fenced, v.claimHolders, v.claimCounts, v.outstanding, v.holds = t.Fenced, t.ClaimHolders, t.ClaimCounts, t.ClaimsOutstanding, t.Holds
		}
		v.shards = append(v.shards, shardRows(t)...)
		first = t.First + uint32(len(t.Homes))
		if len(t.Homes) == 0 || first >= t.ShardsTotal {
			return v, nil
		}
	}
}

// shardRows are t's shards with their homes named.
func shardRows(t client.ShardTable) []shardRow {
	name := func(i uint16) string {
		if i == wire.NoHome || int(i) >= len(t.HomeIDs) {
			return ""
		}
		return t.HomeIDs[i]
	}
	rows := make([]shardRow, len(t.Homes))
	for i := range rows {
		rows[i] = shardRow{shard: t.First + uint32(i), home: name(t.Homes[i]), rendezvous: name(t.Rendezvous[i]),
			gen: t.Generations[i], keys: t.Keys[i]}
	}
	return rows
}

// writeShardSummary prints how many shards each daemon is home of and at
// which generations, the shards without a home, and the read claims.
func writeShardSummary(w io.Writer, v shardView) {
	type homeSum struct {
		shards         int
		minGen, maxGen uint64
		moving         int // shards whose rendezvous member is another
	}
	by := map[string]*homeSum{}
	var ids []string
	none := 0
	for _, r := range v.shards {
		if r.home == "" {
			none++
			continue
		}
		h, ok := by[r.home]
		if !ok {
			h = &homeSum{minGen: r.gen, maxGen: r.gen}
			by[r.home] = h
			ids = append(ids, r.home)
		}
		h.shards++
		h.minGen, h.maxGen = min(h.minGen, r.gen), max(h.maxGen, r.gen)
		if r.rendezvous != r.home {
			h.moving++
		}
	}
	slices.Sort(ids)
	what := "run epoch"
	if v.fenced {
		what = "etcd claim"
	}
	fmt.Fprintf(w, "shards:    %d, homes and generations (%s) as this daemon knows them:\n", len(v.shards), what)
	for _, id := range ids {
		h := by[id]
		me := ""
		if id == v.self {
			me = " (this daemon)"
		}
		gens := fmt.Sprintf("generation %#x", h.minGen)
		if h.minGen != h.maxGen {
			gens = fmt.Sprintf("generations %#x..%#x", h.minGen, h.maxGen)
		}
		fmt.Fprintf(w, "  %-20s home of %d, %s", id+me, h.shards, gens)
		if h.moving > 0 {
			fmt.Fprintf(w, ", %d to move to their rendezvous member", h.moving)
		}
		fmt.Fprintln(w)
	}
	if none > 0 {
		fmt.Fprintf(w, "  %d shards without a home (unclaimed, or claimed by a member down): their keys are misses\n", none)
	}
	writeClaims(w, v)
}

// writeClaims prints the read claims this daemon has outstanding, by
// holder, and the reads other daemons hold here.
func writeClaims(w io.Writer, v shardView) {
	fmt.Fprintf(w, "by holder: %d read claims outstanding as home", v.outstanding)
	for i, h := range v.claimHolders {
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(w, "%s%d at %s", sep, v.claimCounts[i], h)
	}
	fmt.Fprintf(w, "; %d reads held here for other daemons\n", v.holds)
}

// writeShards prints one line per shard this daemon is home of (all:
// every shard).
func writeShards(w io.Writer, v shardView, all bool) {
	fmt.Fprintf(w, "%-6s  %-20s  %-18s  %-20s  %s\n", "SHARD", "HOME", "GENERATION", "RENDEZVOUS", "KEYS")
	n := 0
	for _, r := range v.shards {
		if !all && r.home != v.self {
			continue
		}
		home := r.home
		if home == "" {
			home = "-"
		}
		keys := "-"
		if r.home == v.self {
			keys = fmt.Sprint(r.keys)
		}
		fmt.Fprintf(w, "%-6d  %-20s  %#-18x  %-20s  %s\n", r.shard, home, r.gen, r.rendezvous, keys)
		n++
	}
	if n == 0 {
		fmt.Fprintln(w, "(this daemon is home of no shard; --all shows every shard)")
	}
	writeClaims(w, v)
}

// writeCluster prints the cluster_* counters of cs; false when there are
// none (the store is this host's alone).
func writeCluster(w io.Writer, cs []wire.Counter) bool {
	m := map[string]uint64{}
	for _, c := range cs {
		if name, ok := strings.CutPrefix(c.Name, "cluster_"); ok {
			m[name] = c.Value
		}
	}
	if len(m) == 0 {
		fmt.Fprintln(w, "the store is this host's alone (no peers configured, no peer plane, or [[tenants]])")
		return false
	}
	fmt.Fprintf(w, "members:   %d up (this daemon included)\n", m["members"])
	fmt.Fprintf(w, "home of:   %d shards, %d keys indexed\n", m["home_shards"], m["index_keys"])
	fmt.Fprintf(w, "claims:    %d held here by other daemons' readers\n", m["claims"])
	fmt.Fprintf(w, "remote:    %d hits, %d misses, %d failures, %s read, %d crc32c mismatches\n",
		m["remote_hits"], m["remote_misses"], m["remote_failures"], bytesStr(m["remote_bytes"]), m["crc_mismatches"])
	fmt.Fprintf(w, "one trip:  %d remote gets read in one exchange with the holder (the bytes in its answer), %d begun so and read by a hold instead\n",
		m["one_round_trip_reads"], m["one_round_trip_fallbacks"])
	asked, cached := m["home_lookups"], m["home_cache_hits"]
	rate := "-"
	if asked+cached > 0 {
		rate = fmt.Sprintf("%.1f%%", 100*float64(cached)/float64(asked+cached))
	}
	fmt.Fprintf(w, "lookups:   %d keys asked of other homes, %d from the cache of their answers (hit rate %s), %d answered here\n",
		asked, cached, rate, m["home_lookups_local"])
	fmt.Fprintf(w, "announce:  %d keys re-announced to new homes\n", m["reannounced"])
	fmt.Fprintf(w, "as home:   %d claims outstanding, %d reads answered busy (every copy at its reader limit)\n",
		m["home_claims"], m["home_claims_refused"])
	fmt.Fprintf(w, "replicas:  %d copies of each value, %d copies made elsewhere, %d failed\n",
		m["replicas"], m["replicas_made"], m["replica_failures"])
	fmt.Fprintf(w, "mode:      %s (%d remote gets or serves over its budget; tcctl mode changes it)\n",
		grant.Mode(m["mode"]), m["over_budget"])
	return true
}

// locateCmd prints key's shard, its home and generation, and its holders.
func locateCmd(sock, key string, w io.Writer) error {
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	l, err := c.ClusterLocate([]byte(key))
	if err != nil {
		return err
	}
	writeLocation(w, key, l)
	return nil
}

// writeLocation prints where key lives.
func writeLocation(w io.Writer, key string, l client.KeyLocation) {
	fmt.Fprintf(w, "key:        %q\n", key)
	fmt.Fprintf(w, "shard:      %d\n", l.Shard)
	fmt.Fprintf(w, "home:       %s (generation %#x)\n", l.Home, l.Generation)
	if len(l.Holders) == 0 {
		fmt.Fprintln(w, "holders:    none (no daemon holds it, as its home says)")
		return
	}
	fmt.Fprintf(w, "holders:    %d\n", len(l.Holders))
	for i, h := range l.Holders {
		tier := "dram"
		if l.HolderTiers[i] == 2 {
			tier = "nvme"
		}
		fmt.Fprintf(w, "  %-20s epoch %#x  %s  %s  crc32c %#08x\n", h, l.HolderEpochs[i], tier, bytesStr(l.HolderSizes[i]), l.HolderCRCs[i])
	}
}
