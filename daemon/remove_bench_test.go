package daemon

import (
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// BenchmarkStoreRemoveLatency measures the latency of a remove of one
// 4 KiB key across hosts, beside a bare peer exchange between the same
// two daemons:
//
//	l1  d1 holds the key in its pool only (no L2): the remove takes it
//	    out of d1's store, then asks its home, d2, to remove every
//	    other copy (there is none), one exchange;
//	l2  the same with the key put durable, on d1's L2: d1's removal
//	    ends once the key's block header is overwritten on the device,
//	    and only then is d2 asked (so that the other hosts' answer is
//	    the key's last word).
//
// Each b.N round, a client of d1 puts latencyBlock keys and waits until
// d2's index names d1 for each (untimed), then removes them one after
// another (each timed, the client's call), then times as many bare
// exchanges d1 → d2 (a cluster hello). remove-us is the median remove,
// exchange-us the median exchange, ratio their quotient. cpu-us is the
// process's CPU time (both daemons and the client) per remove, the
// untimed puts and exchanges included.
//
// go test -run '^$' -bench '^BenchmarkStoreRemoveLatency$' -benchtime 10x ./daemon/
func BenchmarkStoreRemoveLatency(b *testing.B) {
	for _, row := range []struct {
		name    string
		l2      string
		durable bool
	}{{"l1", "off", false}, {"l2", "", true}} {
		b.Run(row.name, func(b *testing.B) {
			d1, d2 := benchPair(b, 64<<20, func(c *Config) { c.StoreL2Path = row.l2 })
			removeLatency(b, d1, d2, row.durable)
		})
	}
}

func removeLatency(b *testing.B, d1, d2 *peerDaemon, durable bool) {
	c := d1.dial(b, "remover")
	exch := bareExchange(b, d1, "d2")
	// Keys whose home is d2, so that every remove asks it.
	next := 0
	key := func() []byte {
		for {
			next++
			k := fmt.Appendf(nil, "rm/%d", next)
			if w, err := d1.d.cluster.Where(k); err == nil && w.Home == "d2" {
				return k
			}
		}
	}
	results := make([]error, 1)
	// A round puts latencyBlock keys and waits until d2's index names d1
	// for each (untimed), then removes them one after another (timed
	// each), then times as many exchanges.
	round := func(rm, ex *[]time.Duration) {
		keys := make([][]byte, latencyBlock)
		for i := range keys {
			keys[i] = key()
			if err := c.PutBytes(keys[i], clusterValue(keys[i], 4<<10), durable); err != nil {
				b.Fatal(err)
			}
		}
		for _, k := range keys {
			testutil.Eventually(b, 10*time.Second, func() bool {
				_, hs, err := d2.d.cluster.Locate(k)
				return err == nil && len(hs) > 0
			}, "%s announced to d2", k)
		}
		for _, k := range keys {
			t0 := time.Now()
			if err := c.StoreRemove([][]byte{k}, results); err != nil || results[0] != nil {
				b.Fatalf("remove %s: %v, %v", k, err, results[0])
			}
			*rm = append(*rm, time.Since(t0))
		}
		for range latencyBlock {
			*ex = append(*ex, exch())
		}
	}
	var rm, ex []time.Duration
	round(&rm, &ex) // warm: the sessions and the first exchanges
	rm, ex = rm[:0], ex[:0]
	cpu0 := testutil.ProcessCPU()
	b.ResetTimer()
	for range b.N {
		round(&rm, &ex)
	}
	b.StopTimer()
	cpu := testutil.ProcessCPU() - cpu0
	mr, me := median(rm), median(ex)
	b.ReportMetric(float64(mr.Nanoseconds())/1e3, "remove-us")
	b.ReportMetric(float64(me.Nanoseconds())/1e3, "exchange-us")
	b.ReportMetric(float64(mr)/float64(me), "ratio")
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(len(rm)), "cpu-us")
}
