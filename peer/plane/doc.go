// Package plane is tensorcast's peer plane: a daemon's sessions with the
// other daemons and how requests reach their segments.
//
// It owns:
//   - the tcp node (Plane.Node) that carries the sessions, serving peers
//     from the daemon's export table (package peer), and opening other
//     daemons' segments as "peer/segment" (Plane.OpenRemote), through the
//     multi-host directory's Resolver when there is one, as the request's
//     lane allows; the mapping of the plane's errors to client codes
//     (Plane.Code) and what the directory lists about this daemon
//     (Plane.Member);
//   - the RDMA plane, when a device is usable (rdma.go): one link per peer,
//     a composite transport (rdmaLink, rdma_link.go) that sends what RDMA
//     cannot carry to tcp; the worker goroutine that brings links up and
//     retires them, and resolves remote segments (rdma_lifecycle.go); the
//     pools' local registrations (made
//     once at start-up), the client buffers' (off the submit path, in a
//     registration queue: rdma_regs.go, rdma_locals.go), and one per
//     export a peer resolved, with the export's rights as its remote
//     access, revoked when the export ends (rdma_exports.go); the
//     transport pinned per remote segment (rdma_pins.go); notified WRITEs,
//     whose notification follows the RDMA WRITE on the peer channel
//     (rdma_notify.go); what tcctl rdma and tcctl stats report
//     (rdma_info.go, rdma_stats.go);
//   - the peer-channel exchanges these need: queue-pair connection data
//     (rdma.ExchangeKind), segment resolution, revocation and
//     notifications.
//
// The daemon routes remote targets to Plane.Route and stops the plane in
// two steps (Plane.Stop, Plane.Close: see Plane). It is tested without a
// device over rdmatest's in-memory fabric (the TestFabric* tests) and over
// real verbs in the Soft-RoCE VM (the TestVerbs* tests, make test-rdma).
package plane
