// Package peer is what tensorcast's peer plane shares with the control
// server: the export table and notification delivery, and the names and
// errors both sides speak. It imports no transport, so the control server
// (and its tests) get it without the tcp node's event loops.
//
// It owns:
//   - the export table (Exports): the segments local clients let peers
//     reach under a name of their tenant, with the rights they grant and
//     the other tenants they grant them to (Exports.Resolve decides which
//     export a peer's client of a tenant reaches), looked up on every
//     peer request under a read lock of one shard of the names, never a
//     global lock; an export's end (Export.End) takes the name at once,
//     waits for the peer requests in its range (woken by the last one's
//     release, not polling) and then runs what the RDMA plane registered
//     to revoke (Export.OnEnd);
//   - notification delivery: the subscribers' bounded queues (Inbox), which
//     a WRITE's notification lands in, in every subscriber or in none,
//     before the writer gets its ACK, and which their owners sleep on
//     until one is queued (Inbox.Wait);
//   - the names of exports and of remote segments ("peer/segment"), the
//     rights they carry, a request's context for opening one (OpenContext)
//     and what an opened one is (RemoteSegment);
//   - the sentinel errors of the plane (errors.go), which the control
//     server maps to client codes.
//
// The plane itself (sessions with other daemons over a tcp node, opening
// their segments) is package peer/plane, its RDMA links and registrations
// package rdma/link; the daemon builds both and hands the table to each.
package peer
