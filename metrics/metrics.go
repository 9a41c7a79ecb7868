// Package metrics is tensorcastd's Prometheus endpoint. Components do not
// count into Prometheus types: each keeps its own counters (sharded atomics
// on hot paths) and registers a Source that reads them at scrape time, so a
// scrape costs the hot path nothing.
//
// Adding a component's figures is one registration at start-up:
//
//	reg.Register("queue", metrics.SourceFunc(func(e *metrics.Emit) {
//		for _, q := range queues.Stats() {
//			e.Gauge("tensorcast_queue_depth", "Entries waiting in the queue.", float64(q.Depth), metrics.L("queue", q.Name))
//		}
//	}))
//
// Names follow Prometheus' conventions: tensorcast_ prefix, base units
// (seconds, bytes), _total on counters. A name keeps one help text, one
// type and one set of label names wherever it is emitted.
package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/tensorcast/tensorcast/internal/loghist"
)

// Label is one label of a sample.
type Label struct{ Name, Value string }

// L is a Label.
func L(name, value string) Label { return Label{name, value} }

// Source is one component's figures. Collect emits them; it runs on every
// scrape, possibly concurrently with itself, and must not block for long.
type Source interface {
	Collect(e *Emit)
}

// SourceFunc is a Source written as a function.
type SourceFunc func(e *Emit)

// Collect calls f.
func (f SourceFunc) Collect(e *Emit) { f(e) }

// Registry holds the registered sources and the process-wide collectors
// (build info, Go runtime, process).
type Registry struct {
	prom *prometheus.Registry

	// mu guards the fields below.
	mu      sync.Mutex
	descs   map[string]*family
	sources map[string]bool
}

// family is what the first emission of a name fixed: its type, help and
// label names.
type family struct {
	desc   *prometheus.Desc
	typ    string
	help   string
	labels []string
}

// BuildInfo describes the running binary.
type BuildInfo struct {
	Version   string // the daemon's version
	GoVersion string // runtime.Version()
	Revision  string // VCS revision the binary was built from ("unknown" without one)
}

// ReadBuildInfo fills BuildInfo for version from the binary's embedded
// build information.
func ReadBuildInfo(version string) BuildInfo {
	b := BuildInfo{Version: version, GoVersion: runtime.Version(), Revision: "unknown"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && b.Revision != "unknown" {
			b.Revision += "-dirty"
		}
	}
	return b
}

// NewRegistry returns a registry that already exports build info and the
// Go runtime's and the process's standard figures.
func NewRegistry(b BuildInfo) *Registry {
	r := &Registry{prom: prometheus.NewRegistry(), descs: map[string]*family{}, sources: map[string]bool{}}
	r.prom.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := r.Register("build", SourceFunc(func(e *Emit) {
		e.Gauge("tensorcast_build_info", "The running tensorcastd's version, Go version and VCS revision (always 1).", 1,
			L("version", b.Version), L("goversion", b.GoVersion), L("revision", b.Revision))
	})); err != nil {
		panic(err)
	}
	return r
}

// Register adds a source under a unique name (for errors and logs).
func (r *Registry) Register(name string, s Source) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sources[name] {
		return fmt.Errorf("metrics: source %q registered twice", name)
	}
	r.sources[name] = true
	return r.prom.Register(&collector{r: r, name: name, src: s})
}

// WriteText writes one scrape in the Prometheus text format: what the
// sources gathered, and the error of any that failed.
func (r *Registry) WriteText(w io.Writer) error {
	b, err := r.render()
	if _, werr := w.Write(b); werr != nil {
		return werr
	}
	return err
}

// family returns the family of name, creating it on first use; it refuses
// an emission whose type, help or label names differ from the first.
func (r *Registry) family(typ, name, help string, labels []Label) (*family, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.descs[name]
	if f == nil {
		names := make([]string, len(labels))
		for i, l := range labels {
			names[i] = l.Name
		}
		f = &family{desc: prometheus.NewDesc(name, help, names, nil), typ: typ, help: help, labels: names}
		r.descs[name] = f
		return f, nil
	}
	if f.typ != typ || f.help != help || len(f.labels) != len(labels) {
		return nil, fmt.Errorf("metrics: %s emitted as %s with %d labels, first as %s with %v", name, typ, len(labels), f.typ, f.labels)
	}
	for i, l := range labels {
		if f.labels[i] != l.Name {
			return nil, fmt.Errorf("metrics: %s emitted with label %q where it first had %q", name, l.Name, f.labels[i])
		}
	}
	return f, nil
}

// collector adapts a Source to Prometheus. It describes nothing up front
// (an unchecked collector): the families a source emits depend on what
// exists at scrape time (which transports, peers, rings).
type collector struct {
	r    *Registry
	name string
	src  Source
}

func (c *collector) Describe(chan<- *prometheus.Desc) {}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	e := &Emit{r: c.r, ch: ch, source: c.name}
	c.src.Collect(e)
}

// Emit receives one source's samples during a scrape.
type Emit struct {
	r      *Registry
	ch     chan<- prometheus.Metric
	source string
	values []string
}

func (e *Emit) labelValues(labels []Label) []string {
	e.values = e.values[:0]
	for _, l := range labels {
		e.values = append(e.values, l.Value)
	}
	return slices.Clone(e.values)
}

func (e *Emit) send(typ, name, help string, labels []Label, mk func(d *prometheus.Desc, lv []string) (prometheus.Metric, error)) {
	f, err := e.r.family(typ, name, help, labels)
	if err == nil {
		var m prometheus.Metric
		if m, err = mk(f.desc, e.labelValues(labels)); err == nil {
			e.ch <- m
			return
		}
	}
	e.ch <- prometheus.NewInvalidMetric(prometheus.NewDesc(name, help, nil, nil), fmt.Errorf("source %s: %w", e.source, err))
}

// Counter emits a monotonic count.
func (e *Emit) Counter(name, help string, v float64, labels ...Label) {
	e.send("counter", name, help, labels, func(d *prometheus.Desc, lv []string) (prometheus.Metric, error) {
		return prometheus.NewConstMetric(d, prometheus.CounterValue, v, lv...)
	})
}

// Gauge emits a value that goes up and down.
func (e *Emit) Gauge(name, help string, v float64, labels ...Label) {
	e.send("gauge", name, help, labels, func(d *prometheus.Desc, lv []string) (prometheus.Metric, error) {
		return prometheus.NewConstMetric(d, prometheus.GaugeValue, v, lv...)
	})
}

// Bool emits a gauge of 1 or 0.
func (e *Emit) Bool(name, help string, v bool, labels ...Label) {
	f := 0.0
	if v {
		f = 1
	}
	e.Gauge(name, help, f, labels...)
}

// LatencyHistogram emits a loghist snapshot (nanoseconds) as a histogram in
// seconds; name should end in _seconds.
func (e *Emit) LatencyHistogram(name, help string, s *loghist.Snapshot, labels ...Label) {
	e.send("histogram", name, help, labels, func(d *prometheus.Desc, lv []string) (prometheus.Metric, error) {
		buckets := make(map[float64]uint64, loghist.Buckets-1)
		var cum uint64
		for i, c := range s.Counts {
			cum += c
			if b := loghist.Bound(i); !math.IsInf(b, 1) {
				buckets[b/1e9] = cum
			}
		}
		return prometheus.NewConstHistogram(d, cum, float64(s.Sum)/1e9, buckets, lv...)
	})
}

// SanitizeLabel makes s usable as a label value that stays readable: it
// keeps printable ASCII and replaces the rest with '_', bounded to 128
// bytes (peer ids and addresses come from configuration and peers).
func SanitizeLabel(s string) string {
	if len(s) > 128 {
		s = s[:128]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '_'
		}
		return r
	}, s)
}

// textContentType is the exposition's: the Prometheus text format.
var textContentType = string(expfmt.NewFormat(expfmt.TypeTextPlain))

// render is one scrape in the text format. A source that fails is left
// out and named in the error; the others are rendered.
func (r *Registry) render() ([]byte, error) {
	var b bytes.Buffer
	mfs, gerr := r.prom.Gather()
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return b.Bytes(), errors.Join(gerr, err)
		}
	}
	return b.Bytes(), gerr
}
