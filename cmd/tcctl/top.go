package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tensorcast/tensorcast/xfer"
)

// top shows, refreshing in place, what the daemon's metrics endpoint says
// per transport, per peer and per io_uring ring: rates from the difference
// of two scrapes, latency percentiles from the difference of their
// histograms.
func top(args []string, getenv func(string) string, w, stderr io.Writer) error {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := "127.0.0.1:9464"
	if a := getenv("TENSORCAST_METRICS_ADDRESS"); a != "" && a != "off" {
		def = a
	}
	addr := fs.String("metrics", def, "the daemon's metrics_address (host:port, or a URL)")
	interval := fs.Duration("interval", time.Second, "refresh period")
	frames := fs.Int("n", 0, "frames to draw, then exit (0: until interrupted)")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return fmt.Errorf("%w: top [--metrics HOST:PORT] [--interval D] [-n FRAMES]", errUsage)
	}
	if *interval < 100*time.Millisecond || *frames < 0 {
		return fmt.Errorf("%w: --interval must be at least 100ms and -n not negative", errUsage)
	}
	url := *addr
	if !strings.Contains(url, "://") {
		url = "http://" + url + "/metrics"
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(stop)
	fmt.Fprint(w, "\x1b[?25l\x1b[2J") // hide the cursor, clear once
	defer fmt.Fprint(w, "\x1b[?25h")
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	var prev *snapshot
	for frame := 1; ; frame++ {
		cur, err := scrapeOnce(hc, url)
		if err != nil {
			return fmt.Errorf("%w\n(is the daemon's metrics endpoint at %s? it is metrics_address in its config; set --metrics)", err, *addr)
		}
		if prev != nil && !cur.at.After(prev.at) {
			// The daemon answered from the rendering the last frame
			// showed (metrics_snapshot_interval): nothing new to rate.
			frame--
			select {
			case <-tick.C:
				continue
			case <-stop:
				return nil
			}
		}
		var b strings.Builder
		render(&b, prev, cur, *addr, frame)
		// Home, each line cleared to its end, then everything below.
		out := strings.ReplaceAll(b.String(), "\n", "\x1b[K\n")
		fmt.Fprint(w, "\x1b[H"+out+"\x1b[J")
		prev = cur
		if *frames > 0 && frame >= *frames {
			return nil
		}
		select {
		case <-tick.C:
		case <-stop:
			return nil
		}
	}
}

// snapshot is one scrape.
type snapshot struct {
	at   time.Time
	fams map[string]*dto.MetricFamily
}

func scrapeOnce(hc *http.Client, url string) (*snapshot, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return newSnapshot(fams, time.Now()), nil
}

// newSnapshot is a scrape's families, at the time the daemon rendered
// them (tensorcast_metrics_rendered_timestamp_seconds), else at now.
func newSnapshot(fams map[string]*dto.MetricFamily, now time.Time) *snapshot {
	s := &snapshot{at: now, fams: fams}
	if ts := s.values("tensorcast_metrics_rendered_timestamp_seconds", ""); len(ts) == 1 && ts[""] > 0 {
		sec, frac := math.Modf(ts[""])
		s.at = time.Unix(int64(sec), int64(frac*1e9))
	}
	return s
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// values returns name's samples keyed by the value of label key (summed
// over the other labels).
func (s *snapshot) values(name, key string) map[string]float64 {
	out := map[string]float64{}
	if s == nil {
		return out
	}
	f := s.fams[name]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		var v float64
		switch {
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		}
		out[label(m, key)] += v
	}
	return out
}

// hist returns name's histograms keyed by the value of label key.
func (s *snapshot) hist(name, key string) map[string]*dto.Histogram {
	out := map[string]*dto.Histogram{}
	if s == nil || s.fams[name] == nil {
		return out
	}
	for _, m := range s.fams[name].GetMetric() {
		out[label(m, key)] = m.GetHistogram()
	}
	return out
}

// quantile estimates the q-quantile of the observations added between a
// and b (a may be nil: since start), interpolating inside the bucket as
// Prometheus' histogram_quantile does. NaN without observations.
func quantile(q float64, a, b *dto.Histogram) float64 {
	if b == nil {
		return math.NaN()
	}
	type bk struct{ le, n float64 }
	var bs []bk
	prevCum := map[float64]uint64{}
	if a != nil {
		for _, x := range a.GetBucket() {
			prevCum[x.GetUpperBound()] = x.GetCumulativeCount()
		}
	}
	for _, x := range b.GetBucket() {
		c := x.GetCumulativeCount()
		if p := prevCum[x.GetUpperBound()]; p <= c {
			c -= p
		}
		bs = append(bs, bk{x.GetUpperBound(), float64(c)})
	}
	total := float64(b.GetSampleCount())
	if a != nil && a.GetSampleCount() <= b.GetSampleCount() {
		total -= float64(a.GetSampleCount())
	}
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lo, prev := 0.0, 0.0
	for _, x := range bs {
		if x.n >= rank {
			if x.n == prev {
				return x.le
			}
			return lo + (x.le-lo)*(rank-prev)/(x.n-prev)
		}
		lo, prev = x.le, x.n
	}
	return lo // in the +Inf bucket: its lower bound
}

func rate(prev, cur *snapshot, name, key string) map[string]float64 {
	out := map[string]float64{}
	if prev == nil {
		return out
	}
	dt := cur.at.Sub(prev.at).Seconds()
	pv := prev.values(name, key)
	for k, v := range cur.values(name, key) {
		if d := v - pv[k]; d >= 0 && dt > 0 {
			out[k] = d / dt
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// render draws one frame. Rates need two scrapes: the first frame shows
// "-" for them and percentiles since the daemon started.
func render(w io.Writer, prev, cur *snapshot, addr string, frame int) {
	var dt string
	if prev != nil {
		dt = cur.at.Sub(prev.at).Round(time.Millisecond).String()
	} else {
		dt = "since start"
	}
	fmt.Fprintf(w, "tcctl top  %s  %s  frame %d  (rates over %s; Ctrl-C quits)\n\n", addr, cur.at.Format("15:04:05"), frame, dt)
	r := func(m map[string]float64, k string, scale float64, f string) string {
		if prev == nil {
			return "-"
		}
		return fmt.Sprintf(f, m[k]/scale)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	// Transports.
	reqs := rate(prev, cur, "tensorcast_transport_requests_total", "transport")
	bytes := rate(prev, cur, "tensorcast_transport_bytes_total", "transport")
	errs := rate(prev, cur, "tensorcast_transport_errors_total", "transport")
	inflight := cur.values("tensorcast_transport_in_flight", "transport")
	hc, hp := cur.hist("tensorcast_transport_latency_seconds", "transport"), prev.hist("tensorcast_transport_latency_seconds", "transport")
	fmt.Fprintln(tw, "TRANSPORT\tIOPS\tMB/s\tERR/s\tIN FLIGHT\tP50\tP99\tP99.9\t")
	for _, t := range sortedKeys(hc) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t\n", t, r(reqs, t, 1, "%.0f"), r(bytes, t, 1e6, "%.1f"), r(errs, t, 1, "%.0f"),
			inflight[t], dur(quantile(0.5, hp[t], hc[t])), dur(quantile(0.99, hp[t], hc[t])), dur(quantile(0.999, hp[t], hc[t])))
	}
	if len(hc) == 0 {
		fmt.Fprintln(tw, "(no transfers yet)\t\t\t\t\t\t\t\t")
	}
	tw.Flush()
	if len(hc) > 0 {
		fmt.Fprintf(w, "(transport percentiles: a sample of the submit calls, about 1 in %d)\n", xfer.SampleEvery)
	}
	// Peers.
	if conn := cur.values("tensorcast_peer_connected", "peer"); len(conn) > 0 {
		fmt.Fprintln(w)
		rx := rate(prev, cur, "tensorcast_peer_received_bytes_total", "peer")
		tx := rate(prev, cur, "tensorcast_peer_sent_bytes_total", "peer")
		pe := rate(prev, cur, "tensorcast_peer_errors_total", "peer")
		rt := rate(prev, cur, "tensorcast_kernel_tcp_retransmits_total", "peer")
		fmt.Fprintln(tw, "PEER\tCONNECTED\tRX MB/s\tTX MB/s\tERR/s\tRETRANS/s\t")
		for _, p := range sortedKeys(conn) {
			up := "no"
			if conn[p] > 0 {
				up = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", p, up, r(rx, p, 1e6, "%.1f"), r(tx, p, 1e6, "%.1f"), r(pe, p, 1, "%.0f"), r(rt, p, 1, "%.0f"))
		}
		tw.Flush()
	}
	// Queues.
	if open := cur.values("tensorcast_queues_open", ""); open[""] > 0 {
		fmt.Fprintln(w)
		one := func(name string) float64 { return cur.values(name, "")[""] }
		comp := rate(prev, cur, "tensorcast_queue_completions_total", "")
		wakes := rate(prev, cur, "tensorcast_queue_client_wakes_total", "")
		sleeps := rate(prev, cur, "tensorcast_queue_worker_sleeps_total", "")
		fmt.Fprintln(tw, "QUEUES\tCQE/s\tIN FLIGHT\tUNREAPED\tCLIENT WAKES/s\tWORKER SLEEPS/s\t")
		fmt.Fprintf(tw, "%.0f\t%s\t%.0f\t%.0f\t%s\t%s\t\n", open[""], r(comp, "", 1, "%.0f"), one("tensorcast_queue_in_flight"),
			one("tensorcast_queue_unreaped"), r(wakes, "", 1, "%.0f"), r(sleeps, "", 1, "%.0f"))
		tw.Flush()
	}
	// io_uring rings as the kernel saw them (eBPF view).
	kc := cur.hist("tensorcast_kernel_uring_latency_seconds", "ring")
	if len(kc) > 0 {
		fmt.Fprintln(w)
		kp := prev.hist("tensorcast_kernel_uring_latency_seconds", "ring")
		fmt.Fprintln(tw, "KERNEL IO_URING RING\tCQE/s\tP50\tP99\tP99.9\t")
		for _, ring := range sortedKeys(kc) {
			cqe := "-"
			if prev != nil && kp[ring] != nil {
				cqe = fmt.Sprintf("%.0f", float64(kc[ring].GetSampleCount()-kp[ring].GetSampleCount())/cur.at.Sub(prev.at).Seconds())
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", ring, cqe, dur(quantile(0.5, kp[ring], kc[ring])),
				dur(quantile(0.99, kp[ring], kc[ring])), dur(quantile(0.999, kp[ring], kc[ring])))
		}
		tw.Flush()
	}
	// The KV block store.
	if keys := cur.values("tensorcast_store_keys", ""); len(keys) > 0 {
		fmt.Fprintln(w)
		tb := cur.values("tensorcast_store_tier_bytes", "tier")
		promo := rate(prev, cur, "tensorcast_store_promotions_total", "")
		wb := rate(prev, cur, "tensorcast_store_writebacks_total", "")
		ev := rate(prev, cur, "tensorcast_store_evictions_total", "")
		fmt.Fprintln(tw, "STORE	KEYS	L1 MB	L2 MB	PINS	DIRTY	PROMOTE/s	WRITEBACK/s	EVICT/s	TOMBSTONES	")
		fmt.Fprintf(tw, "store	%.0f	%.1f	%.1f	%.0f	%.0f	%s	%s	%s	%.0f	\n", keys[""], tb["l1"]/1e6, tb["l2"]/1e6,
			cur.values("tensorcast_store_pins", "")[""], cur.values("tensorcast_store_dirty", "")[""],
			r(promo, "", 1, "%.0f"), r(wb, "", 1, "%.0f"), r(ev, "", 1, "%.0f"), cur.values("tensorcast_store_tombstones_total", "")[""])
		tw.Flush()
	}
	if v := cur.values("tensorcast_ebpf_view_loaded", "view"); len(v) > 0 && v["uring"] == 0 && v["tcp"] == 0 {
		fmt.Fprintln(w, "\n(kernel views off: see the daemon's start-up log)")
	}
}

// dur formats seconds as a short duration; "-" for NaN.
func dur(s float64) string {
	switch {
	case math.IsNaN(s):
		return "-"
	case s < 1e-6:
		return fmt.Sprintf("%.0fns", s*1e9)
	case s < 1e-3:
		return fmt.Sprintf("%.1fµs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1fms", s*1e3)
	}
	return fmt.Sprintf("%.2fs", s)
}
