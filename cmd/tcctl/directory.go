package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tensorcast/tensorcast/client"
)

// directoryCmd prints the daemon's peer directory: the backend and its
// state, the cache's age, hit and fallback rates, and each member with
// its epoch and lease time left. With the embedded directory it says so
// and lists the configured peers.
func directoryCmd(sock string, args []string, w io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: directory takes no arguments", errUsage)
	}
	c, err := dial(sock, false)
	if err != nil {
		return err
	}
	defer c.Close()
	d, err := c.Directory()
	if err != nil {
		return err
	}
	writeDirectory(w, d)
	return nil
}

func writeDirectory(w io.Writer, d client.DirectoryInfo) {
	if d.Backend == "embedded" {
		fmt.Fprintf(w, "backend:  embedded: the peers in this daemon's config (no shared store, no leases; directory = etcd finds the others)\n")
		fmt.Fprintf(w, "self:     %s epoch %#x\n", d.Self, d.Epoch)
		writeMembers(w, d, false)
		return
	}
	fmt.Fprintf(w, "backend:  %s %s prefix %s\n", d.Backend, strings.Join(d.Endpoints, ","), d.Prefix)
	state := d.State
	if d.SinceUnixMS != 0 {
		state += " since " + time.UnixMilli(int64(d.SinceUnixMS)).UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(w, "state:    %s, %d outages\n", state, d.Outages)
	fmt.Fprintf(w, "self:     %s epoch %#x\n", d.Self, d.Epoch)
	fmt.Fprintf(w, "budget:   staleness %v, lease ttl %v\n", msDur(d.BudgetMS), msDur(d.LeaseTTLMS))
	cs := d.Cache
	fmt.Fprintf(w, "cache:    age %s, revision %d, %d members, %d exports, %d dropped (full)\n",
		ageStr(cs.AgeMS), cs.Revision, cs.Members, cs.Exports, cs.Dropped)
	if cs.Lookups == 0 {
		fmt.Fprintf(w, "lookups:  none yet\n")
	} else {
		fallbacks := cs.FallbackStore + cs.FallbackPeer
		fmt.Fprintf(w, "lookups:  %d, hit rate %s, fallback rate %s (store %d, peer %d), failed closed %d, not found %d, corrected %d\n",
			cs.Lookups, pct(cs.Hits, cs.Lookups), pct(fallbacks, cs.Lookups), cs.FallbackStore, cs.FallbackPeer,
			cs.Unavailable, cs.NotFound, cs.Corrections)
	}
	fmt.Fprintf(w, "store:    %d requests, %d fallback reads\n", cs.StoreRequests, cs.StoreReads)
	fmt.Fprintf(w, "catalog:  %d exports published, %d pending\n", d.Published, d.Pending)
	writeMembers(w, d, true)
}

func writeMembers(w io.Writer, d client.DirectoryInfo, leases bool) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if leases {
		fmt.Fprintln(tw, "ID\tEPOCH\tADDR\tCAPS\tAGE\tLEASE LEFT")
	} else {
		fmt.Fprintln(tw, "ID\tEPOCH\tADDR")
	}
	for _, m := range d.Members {
		id := m.ID
		if m.Self {
			id += " (self)"
		}
		epoch, addr := "-", "-"
		if m.Epoch != 0 {
			epoch = fmt.Sprintf("%#x", m.Epoch)
		}
		if m.Addr != "" {
			addr = m.Addr
		}
		if !leases {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", id, epoch, addr)
			continue
		}
		caps, lease := "-", "-"
		if len(m.Caps) > 0 {
			caps = strings.Join(m.Caps, ",")
		}
		if m.LeaseKnown {
			lease = msDur(m.LeaseLeftMS).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", id, epoch, addr, caps, ageStr(m.AgeMS), lease)
	}
	tw.Flush()
	if n := int(d.MembersTotal) - len(d.Members); n > 0 {
		fmt.Fprintf(w, "... and %d more members (the answer holds what fits one frame)\n", n)
	}
}

func msDur(ms uint64) time.Duration { return time.Duration(ms) * time.Millisecond }

func ageStr(ms uint64) string {
	if ms == client.AgeNever {
		return "never"
	}
	return msDur(ms).String()
}

func pct(n, of uint64) string { return fmt.Sprintf("%.1f %%", 100*float64(n)/float64(of)) }
