package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// FuzzRender feeds tcctl top's parser and renderer arbitrary expositions
// (what a metrics endpoint answers is outside bytes): they must not panic,
// whatever two scrapes say, counters going backwards included.
func FuzzRender(f *testing.F) {
	f.Add("# TYPE tensorcast_transport_requests_total counter\ntensorcast_transport_requests_total{transport=\"local\"} 5\n",
		"# TYPE tensorcast_transport_requests_total counter\ntensorcast_transport_requests_total{transport=\"local\"} 3\n")
	f.Add("# TYPE tensorcast_transport_latency_seconds histogram\n"+
		"tensorcast_transport_latency_seconds_bucket{transport=\"local\",le=\"1e-06\"} 4\n"+
		"tensorcast_transport_latency_seconds_bucket{transport=\"local\",le=\"+Inf\"} 4\n"+
		"tensorcast_transport_latency_seconds_sum{transport=\"local\"} 1e-06\n"+
		"tensorcast_transport_latency_seconds_count{transport=\"local\"} 4\n",
		"# TYPE tensorcast_transport_latency_seconds histogram\n"+
			"tensorcast_transport_latency_seconds_bucket{transport=\"local\",le=\"1e-06\"} 9\n"+
			"tensorcast_transport_latency_seconds_bucket{transport=\"local\",le=\"+Inf\"} 2\n"+
			"tensorcast_transport_latency_seconds_sum{transport=\"local\"} 1e-06\n"+
			"tensorcast_transport_latency_seconds_count{transport=\"local\"} 1\n")
	f.Add("tensorcast_peer_connected{peer=\"b\"} 1\ntensorcast_kernel_tcp_retransmits_total{peer=\"b\"} 7\n", "")
	f.Fuzz(func(t *testing.T, a, b string) {
		parse := func(s string, at time.Time) *snapshot {
			p := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := p.TextToMetricFamilies(strings.NewReader(s))
			if err != nil {
				return nil
			}
			return &snapshot{at: at, fams: fams}
		}
		t0 := time.Unix(1000, 0)
		pa, pb := parse(a, t0), parse(b, t0.Add(time.Second))
		if pb == nil {
			return
		}
		render(io.Discard, pa, pb, "fuzz", 2)
		render(io.Discard, nil, pb, "fuzz", 1)
	})
}
