package daemon

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// The bounded drain. On SIGTERM the daemon
//
//  1. stops taking work: the control socket stops accepting, new requests
//     are answered UNAVAILABLE, the requests in flight are answered;
//  2. gives the transports what is left of drain_timeout to finish the
//     tasks they hold (or to end them at their own deadlines);
//  3. at drain_timeout abandons what is still outstanding, and logs it:
//     tasks per transport, and per peer the tcp requests queued and on the
//     wire and the tasks on each rdma link;
//  4. closes everything, in an order where each step ends the waits of the
//     next: the store across hosts detached (store calls stay on this
//     host), the engine (pending tasks canceled), the peer node (dials,
//     handshakes and peer requests end), the store across hosts (its
//     fetches end, the claims it handed out are released), the etcd directory (the lease
//     revoked, at most 1s), the control server (connections
//     released without waiting again, their store sessions closed), the
//     store (its L2 operations in flight end, bounded), the RDMA plane,
//     the file tier, the local transport, the pool.
//
// Step 4 runs on a goroutine of its own and gets closeGrace past
// drain_timeout: if a part does not close by then (a device registration
// in progress cannot be interrupted, an exchange handler still runs), the
// daemon logs which part and gives up on it, and Run returns
// ErrShutdownTimeout so the process exits anyway. The whole shutdown
// never takes longer than drain_timeout + closeGrace.

// closeGrace is how long the parts get to close after drain_timeout.
const closeGrace = 500 * time.Millisecond

// drainPoll is how often the drain looks at what the transports still
// owe (a walk of the engine's tasks; shutdown only).
const drainPoll = 20 * time.Millisecond

// ErrShutdownTimeout: a part of the daemon did not close within
// drain_timeout + closeGrace; the daemon gave up on it. Matches
// xfer.ErrTimeout: the shutdown's deadline passed (Run returns it; no
// client sees it).
var ErrShutdownTimeout = xfer.Categorized(xfer.ErrTimeout, "shutdown: a part did not close in time")

// shutdown drains within drain_timeout, then closes the engine, the
// transports and the pool, giving up on what is not closed by
// drain_timeout + closeGrace. A drain that runs out of time is logged and
// the rest still runs.
func (d *Daemon) shutdown() error {
	var err error
	d.closeOnce.Do(func() {
		d.closeHandoffListener() // a hand-off asked for now is told the daemon stops
		start := time.Now()
		deadline := start.Add(time.Duration(d.cfg.DrainTimeout))
		dctx, cancel := context.WithDeadline(context.Background(), deadline)
		qerr := d.server.Quiesce(dctx)
		cancel()
		if qerr == nil {
			d.waitTransports(deadline)
		}
		d.logAbandoned()

		var step atomic.Pointer[string]
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			d.closeForShutdown(func(s string) { step.Store(&s) })
		}()
		timer := time.NewTimer(time.Until(deadline.Add(closeGrace)))
		defer timer.Stop()
		select {
		case <-closed:
			d.log.Info("tensorcastd stopped", "took", time.Since(start).Round(time.Millisecond).String())
		case <-timer.C:
			at := "?"
			if s := step.Load(); s != nil {
				at = *s
			}
			d.log.Error("shutdown: giving up on a part that did not close in time; exiting anyway",
				"closing", at, "drain_timeout", d.cfg.DrainTimeout.String(), "grace", closeGrace.String(),
				"took", time.Since(start).Round(time.Millisecond).String())
			err = fmt.Errorf("%w: %s still closing %v after the drain started", ErrShutdownTimeout, at, time.Since(start).Round(time.Millisecond))
		}
	})
	return err
}

// waitTransports waits until no dispatched task is owed a Done, or
// deadline.
func (d *Daemon) waitTransports(deadline time.Time) {
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for len(d.engine.Outstanding()) > 0 {
		if !time.Now().Before(deadline) {
			return
		}
		<-t.C
	}
}

// logAbandoned logs what the drain leaves behind: the tasks still owed a
// Done per transport, and per peer what its transports still hold. It
// logs nothing when nothing is left.
func (d *Daemon) logAbandoned() {
	out := d.engine.Outstanding()
	if len(out) == 0 {
		return
	}
	byName := map[string]int{}
	total := 0
	for tr, n := range out {
		byName[tr.Name()] += n
		total += n
	}
	d.log.Warn("drain_timeout passed: abandoning the tasks still in flight", "tasks", total,
		"drain_timeout", d.cfg.DrainTimeout.String())
	for _, name := range sortedKeys(byName) {
		d.log.Warn("abandoned tasks", "transport", name, "tasks", byName[name])
	}
	if d.peers == nil {
		return
	}
	peers, waiting := d.peers.Abandoned(out)
	for _, p := range peers {
		if p.Transport == "tcp" {
			d.log.Warn("abandoned peer requests", "peer", p.Peer, "transport", "tcp", "queued", p.Queued, "in_flight", p.InFlight)
		} else {
			d.log.Warn("abandoned peer requests", "peer", p.Peer, "transport", p.Transport, "tasks", p.InFlight)
		}
	}
	if waiting > 0 {
		d.log.Warn("abandoned tasks waiting for a buffer's rdma registration", "tasks", waiting)
	}
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// closeForShutdown closes the parts in the order the package doc of the
// drain gives, telling at which step it is.
func (d *Daemon) closeForShutdown(at func(string)) {
	// The endpoint goes first: its sources read the parts closed below.
	if d.metricsSrv != nil {
		at("metrics endpoint")
		if err := d.metricsSrv.Close(); err != nil {
			d.log.Warn("closing metrics endpoint", "err", err)
		}
	}
	at("kernel views")
	d.closeKernelViews()
	d.detachCluster()
	at("engine")
	if err := d.engine.Close(); err != nil {
		d.log.Warn("closing engine", "err", err)
	}
	if d.peers != nil {
		at("peer node")
		d.peers.Stop()
	}
	at("store across hosts")
	d.closeCluster()
	if d.dir != nil {
		// Leaving revokes the lease: the others see this daemon and its
		// exports go at once, not a TTL later.
		at("directory")
		d.dir.Close()
	}
	at("control server")
	if err := d.server.Close(); err != nil {
		d.log.Warn("closing control server", "err", err)
	}
	at("store")
	d.closeStore()
	if d.peers != nil {
		at("rdma plane")
		d.peers.Close()
	}
	if d.files != nil {
		at("file tier") // and the reactor workers it hosts
		d.files.Close()
	}
	at("reactors")
	d.reactors.Close()
	at("local transport")
	if err := d.local.Close(); err != nil {
		d.log.Warn("closing local transport", "err", err)
	}
	if d.hand != nil && d.hand.conn != nil {
		at("hand-off")
		d.handOver() // closes the journals and the pools
	} else {
		at("pools")
		d.closeJournals()
		d.closePools()
	}
	// Nothing of this daemon writes the pools, the journals or the L2
	// files now: the next daemon may start.
	at("lock")
	d.releaseLock()
	d.closeHandoff()
}
