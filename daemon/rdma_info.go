package daemon

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/xfer"
)

// rdmaReport is what `tcctl rdma` shows (control.RDMAReporter): the RDMA
// plane's device, port and GID, the pool's registration and each peer's
// link; or, for a daemon without a plane, whether RDMA is off or
// unavailable and why.
type rdmaReport struct {
	p      *rdmaPlane // nil: RDMA is off or unavailable
	port   int        // the device port the plane uses
	state  control.RDMAState
	reason string
}

var _ control.RDMAReporter = (*rdmaReport)(nil)

// rdmaWithoutPeers is the report of a daemon without a peer plane.
func rdmaWithoutPeers() *rdmaReport {
	return &rdmaReport{state: control.RDMAOff, reason: "no peer plane (peer_listen is not set): RDMA is set up over it"}
}

// openRDMA is newRDMAPlane that also returns the report. When no plane is
// made, newRDMAPlane has logged why (rdma = off, the device's open error,
// the failed registration); the report keeps that record's text.
func openRDMA(cfg Config, pool xfer.MemSegment, peers *peerPlane, log *slog.Logger) (*rdmaPlane, *rdmaReport, error) {
	h := &whyHandler{next: log.Handler(), why: &lastRecord{}}
	p, err := newRDMAPlane(cfg, pool, peers, slog.New(h))
	h.why.done.Store(true)
	if err != nil {
		return nil, nil, err
	}
	if p != nil {
		return p, &rdmaReport{p: p, port: openedPort(cfg, p.dev.Name()), state: control.RDMAEnabled}, nil
	}
	h.why.mu.Lock()
	r := &rdmaReport{state: control.RDMAUnavailable, reason: h.why.text}
	h.why.mu.Unlock()
	if cfg.RDMA == "off" {
		r.state = control.RDMAOff
	}
	if r.reason == "" {
		r.reason = "no usable RDMA device (the daemon's start-up log says why)"
		if r.state == control.RDMAOff {
			r.reason = "rdma = off"
		}
	}
	return nil, r, nil
}

// openedPort is the port rdma.Open took on dev: with no rdma_device
// configured, the device's first active port (rdma.Open picks the first
// device with one); otherwise the default port. The rdma package does not
// report it.
func openedPort(cfg Config, dev string) int {
	if cfg.RDMADevice == "" {
		for _, d := range rdma.ListDevices() {
			if d.Name != dev {
				continue
			}
			for _, pi := range d.Ports {
				if pi.Active() {
					return pi.Port
				}
			}
		}
	}
	return rdma.DefaultConfig().Port
}

// RDMAInfo implements control.RDMAReporter.
func (r *rdmaReport) RDMAInfo() control.RDMAInfo {
	if r.p == nil {
		return control.RDMAInfo{State: r.state, Reason: r.reason}
	}
	return r.p.info(r.port)
}

// info reports the plane: its device and registration, and every peer the
// peer plane knows or the RDMA plane has a link, an accepting transport or
// a logged choice for. Not a hot path: it allocates.
func (p *rdmaPlane) info(port int) control.RDMAInfo {
	a := p.dev.Addr()
	out := control.RDMAInfo{
		State: control.RDMAEnabled, Device: p.dev.Name(), Port: uint32(port),
		GID: a.GID.String(), GIDIndex: uint32(a.GIDIndex), MTU: uint32(a.MTU.Bytes()), LID: a.LID,
		PoolRegistered: p.reg.Size(), PoolMRs: uint32(p.reg.Chunks()),
	}
	byID := map[string]*control.RDMAPeer{}
	peer := func(id string) *control.RDMAPeer {
		e := byID[id]
		if e == nil {
			e = &control.RDMAPeer{ID: id}
			byID[id] = e
		}
		return e
	}
	for _, s := range p.node.Peers() {
		peer(s.ID)
	}
	said := map[string]string{}
	p.mu.Lock()
	for id, ap := range p.accepted {
		e := peer(id)
		e.Accepting, e.AcceptedEpoch = true, ap.epoch
	}
	for id, tr := range p.said {
		said[id] = tr
		peer(id)
	}
	p.mu.Unlock()
	links := *p.links.Load()
	for id, l := range links {
		e := peer(id)
		e.Link, e.Epoch = "up", l.epoch
		e.QueuePairs = uint32(rdma.DefaultConfig().QPs)
		e.Segments = uint32(len(*l.segs.Load()))
	}
	for id, e := range byID {
		// Requests go to tcp until the worker has chosen rdma for the peer.
		e.Transport = "tcp"
		if said[id] == "rdma" && e.Link == "up" {
			e.Transport = "rdma"
		}
		if e.Link == "" {
			e.Link = "none"
			if said[id] == "tcp" {
				e.Link = "failed" // retried after linkRetry
			}
		}
		out.Peers = append(out.Peers, *e)
	}
	slices.SortFunc(out.Peers, func(x, y control.RDMAPeer) int { return strings.Compare(x.ID, y.ID) })
	return out
}

// whyHandler passes records on to next and, until why.done, keeps the text
// of the last one at Info or above, whatever level next logs at.
type whyHandler struct {
	next slog.Handler
	why  *lastRecord // shared with the handlers WithAttrs and WithGroup make
}

// lastRecord is the text of the last record a whyHandler kept.
type lastRecord struct {
	done atomic.Bool // set once the plane is built: nothing more is kept
	// mu guards text.
	mu   sync.Mutex
	text string
}

func (h *whyHandler) keeping(l slog.Level) bool { return l >= slog.LevelInfo && !h.why.done.Load() }

func (h *whyHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.keeping(l) || h.next.Enabled(ctx, l)
}

func (h *whyHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.keeping(r.Level) {
		var b strings.Builder
		b.WriteString(r.Message)
		sep := ": "
		r.Attrs(func(a slog.Attr) bool {
			b.WriteString(sep)
			b.WriteString(a.Value.String())
			sep = "; "
			return true
		})
		h.why.mu.Lock()
		h.why.text = b.String()
		h.why.mu.Unlock()
	}
	if !h.next.Enabled(ctx, r.Level) {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *whyHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &whyHandler{next: h.next.WithAttrs(as), why: h.why}
}

func (h *whyHandler) WithGroup(name string) slog.Handler {
	return &whyHandler{next: h.next.WithGroup(name), why: h.why}
}
