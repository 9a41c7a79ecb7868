package daemon

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tensorcast/tensorcast/ktrace"
	"github.com/tensorcast/tensorcast/metrics"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/wire"
)

// openKernelViews loads the eBPF views this daemon has a use for: io_uring
// latency with the file tier, TCP retransmits with the peer plane. With
// ebpf = auto a view that cannot load is logged, in one line for all of
// them, and the daemon runs without it; with ebpf = on it fails start-up.
func (d *Daemon) openKernelViews() error {
	if d.cfg.EBPF == "off" {
		d.log.Debug("ebpf views off (ebpf = off)")
		return nil
	}
	var want []ktrace.View
	if d.files != nil {
		want = append(want, ktrace.ViewUring)
	}
	if d.peers != nil {
		want = append(want, ktrace.ViewTCP)
	}
	if len(want) == 0 {
		return nil
	}
	v, errs := ktrace.Open(want, ktrace.Options{UringFlag: uring.TracedUserData})
	d.kviews = v
	if len(errs) == 0 {
		d.log.Info("ebpf views loaded", "views", want, "uring_sample", fmt.Sprintf("1 in %d", d.cfg.EBPFUringSample))
		return nil
	}
	reason := viewErrors(want, errs)
	if d.cfg.EBPF == "on" {
		return fmt.Errorf("%w: ebpf = on, but %s", ErrConfig, reason)
	}
	attrs := []any{"reason", reason}
	if v != nil {
		var loaded []ktrace.View
		for _, w := range want {
			if v.Has(w) {
				loaded = append(loaded, w)
			}
		}
		attrs = append(attrs, "loaded", loaded)
	}
	d.log.Warn("ebpf views unavailable; running without them", attrs...)
	return nil
}

// viewErrors says in one phrase why views failed: a missing capability
// once for all, else each view's missing hook.
func viewErrors(want []ktrace.View, errs map[ktrace.View]error) string {
	var parts []string
	for _, w := range want {
		err := errs[w]
		if err == nil {
			continue
		}
		if errors.Is(err, ktrace.ErrNoCapability) {
			return err.Error()
		}
		parts = append(parts, fmt.Sprintf("%s view: %v", w, err))
	}
	return strings.Join(parts, "; ")
}

func (d *Daemon) closeKernelViews() {
	if d.kviews != nil {
		if err := d.kviews.Close(); err != nil {
			d.log.Warn("closing ebpf views", "err", err)
		}
	}
}

// peerRetransmits pairs the kernel's retransmit counts with this daemon's
// peer connections.
func (d *Daemon) peerRetransmits() []peerRetransmit {
	if d.kviews == nil || d.peers == nil || !d.kviews.Has(ktrace.ViewTCP) {
		return nil
	}
	return matchRetransmits(d.peers.Node().ConnAddrs(), d.kviews.Retransmits())
}

// matchRetransmits keeps the kernel's counts of the connections in conns,
// each with its peer.
func matchRetransmits(conns []tcp.ConnAddr, rs []ktrace.Retransmit) []peerRetransmit {
	byTuple := make(map[ktrace.Tuple]tcp.ConnAddr, len(conns))
	for _, c := range conns {
		byTuple[ktrace.Tuple{Local: c.Local, Remote: c.Remote}] = c
	}
	var out []peerRetransmit
	for _, r := range rs {
		if c, ok := byTuple[r.Tuple]; ok {
			out = append(out, peerRetransmit{conn: c, n: r.Count})
		}
	}
	return out
}

type peerRetransmit struct {
	conn tcp.ConnAddr
	n    uint64
}

// collectKernel is the metrics source of the eBPF views.
func (d *Daemon) collectKernel(e *metrics.Emit) {
	for _, w := range []ktrace.View{ktrace.ViewUring, ktrace.ViewTCP} {
		e.Bool("tensorcast_ebpf_view_loaded", "Whether the eBPF view is loaded (see the start-up log for why not).",
			d.kviews != nil && d.kviews.Has(w), metrics.L("view", string(w)))
	}
	if d.kviews == nil {
		return
	}
	for _, r := range d.kviews.Rings() {
		e.LatencyHistogram("tensorcast_kernel_uring_latency_seconds", "io_uring submit to completion as the kernel saw it, per ring of this process: a sample, about one request in ebpf_uring_sample (tensorcast_uring_ring_traced_sqes_total counts them).",
			&r.Latency, metrics.L("ring", strconv.Itoa(r.ID)))
	}
	for _, r := range d.peerRetransmits() {
		dir := "inbound"
		if r.conn.Outbound {
			dir = "outbound"
		}
		e.Counter("tensorcast_kernel_tcp_retransmits_total", "TCP segments (skbs) the kernel retransmitted on a peer connection.",
			float64(r.n), metrics.L("peer", metrics.SanitizeLabel(r.conn.Peer)), metrics.L("direction", dir),
			metrics.L("local", r.conn.Local.String()), metrics.L("remote", r.conn.Remote.String()))
	}
}

// kernelCounters are the eBPF views' figures for tcctl stats.
func (d *Daemon) kernelCounters(dst []wire.Counter) []wire.Counter {
	if d.kviews == nil {
		return dst
	}
	for _, r := range d.kviews.Rings() {
		p := "kernel.uring.ring" + strconv.Itoa(r.ID) + "."
		dst = append(dst,
			wire.Counter{Name: p + "completions", Value: r.Latency.Count()},
			wire.Counter{Name: p + "p99_ns", Value: uint64(r.Latency.Quantile(0.99))})
	}
	per := map[string]uint64{}
	for _, r := range d.peerRetransmits() {
		per[r.conn.Peer] += r.n
	}
	for p, n := range per {
		dst = append(dst, wire.Counter{Name: "kernel.tcp.retransmits." + p, Value: n})
	}
	return dst
}
