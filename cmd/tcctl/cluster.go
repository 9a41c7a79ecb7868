package main

import (
	"fmt"
	"io"
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
	if len(args) > 0 {
		return fmt.Errorf("%w: cluster takes no arguments, or locate KEY", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	st, err := c.Stats()
	if err != nil {
		return err
	}
	writeCluster(w, st.Transports)
	return nil
}

// writeCluster prints the cluster_* counters of cs.
func writeCluster(w io.Writer, cs []wire.Counter) {
	m := map[string]uint64{}
	for _, c := range cs {
		if name, ok := strings.CutPrefix(c.Name, "cluster_"); ok {
			m[name] = c.Value
		}
	}
	if len(m) == 0 {
		fmt.Fprintln(w, "the store is this host's alone (no peers configured, no peer plane, or [[tenants]])")
		return
	}
	fmt.Fprintf(w, "members:   %d up (this daemon included)\n", m["members"])
	fmt.Fprintf(w, "home of:   %d shards, %d keys indexed\n", m["home_shards"], m["index_keys"])
	fmt.Fprintf(w, "claims:    %d held here by other daemons' readers\n", m["claims"])
	fmt.Fprintf(w, "remote:    %d hits, %d misses, %d failures, %s read, %d crc32c mismatches\n",
		m["remote_hits"], m["remote_misses"], m["remote_failures"], bytesStr(m["remote_bytes"]), m["crc_mismatches"])
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
