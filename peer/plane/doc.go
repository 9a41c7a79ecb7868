// Package plane is tensorcast's peer plane: a daemon's sessions with the
// other daemons and how requests reach their segments.
//
// It owns:
//   - the tcp node (Plane.Node) that carries the sessions, serving peers
//     from the daemon's export table (package peer), and opening other
//     daemons' segments as "peer/segment" (Plane.OpenRemote), through the
//     multi-host directory's Resolver when there is one, as the request's
//     lane allows; and what the directory lists about this daemon
//     (Plane.Member);
//   - the choice of RDMA at start-up (RDMAConfig's mode) and, when a
//     device is usable, package rdma/link's Links, which Route asks first
//     for each remote target: a peer's RDMA link, or nil for tcp; the
//     links own the device, the registrations, the links' worker and the
//     exchanges RDMA needs on the peer channel.
//
// The daemon routes remote targets to Plane.Route and stops the plane in
// two steps (Plane.Stop, Plane.Close: see Plane). The RDMA links are
// tested in package rdma/link, over rdmatest's in-memory fabric and over
// real verbs in the Soft-RoCE VM.
package plane
