// Package tcp is the peer data plane over TCP: the transport every fleet
// without RDMA runs on. One Node per daemon listens for peers and dials them
// on gnet event loops, authenticates both sides with the cluster key,
// hands out capability tokens for exported segments and moves READ and WRITE
// requests, sliced and striped over several connections per peer, with
// bounded in-flight bytes per connection and per peer. A READ's payload
// goes from the socket into its destination; when the task asks for its
// checksum (xfer.Task.Sum) and one slice carries it whole, the event loop
// takes the crc32c of each piece as it lands, while it is in cache.
//
// Nothing blocks the submitting goroutine. Submit sends what the peer's
// session and flow-control window take at once; a task whose peer has no
// session yet, or no room, waits in the peer's queue (bounded by
// Config.MaxQueued; past it a task fails with ErrBacklog) and the peer's
// pump goroutine sends it when the session is up and room frees. A waiting
// task ends at its own deadline (xfer.Task.Deadline) or RequestTimeout,
// whichever comes first, or when its dial fails; Cancel ends a waiting
// task at once. Dials and handshakes run only on the pump, bounded by
// HandshakeTimeout and canceled by Close.
//
// Goroutines and stop order. A Node owns: the listener's accept goroutine,
// which enrolls each connection a peer dials in the inbound gnet event
// loops (see accept in node.go), those loops, the gnet client (event loops
// for the connections this node dialed), one reaper goroutine (request,
// notification and queue deadlines, handshake timeouts, stalled
// connections; see reaper.go), one pump goroutine per peer it has sent to
// (started on first use, see pump.go) and one writer goroutine per dialed
// connection (the large frames and the rest of partial writes, see
// writer.go). Close stops them in this order: refuse new work, wake
// waiters and cancel dials in progress (done channel, context), stop the
// reaper, wait for the pumps, fail the tasks still queued, stop the client
// (every dialed connection closes, which stops its writer, and fails what
// it carried), wait for the writers, close the listener, wait for the
// accept goroutine, stop the inbound event loops (every connection a peer
// dialed closes), wait for running exchange handlers (see Handle), then
// wait until no task is outstanding (woken by the last task's end, for a
// second at most).
//
// Exchanges. A request/response exchange runs its handler on a goroutine
// the node owns, at most 16 at once, beyond which the peer is answered
// busy (ErrPeerBusy); handlers that make exchanges of their own and wait
// on them are registered with HandleNested and have a bound of 16 of
// their own, so they never take the room of the handlers they wait on,
// here or at a peer (see Handle, HandleNested).
//
// Peers. Only daemons the directory lists (Config.Peers, or entries added
// to the Directory) are accepted on the listener; any other id is refused
// after authentication, and refusals are logged at most once per
// refuseLogEvery with a count, as are the drops of connections that sent a
// malformed or out-of-order frame before authenticating and the refusals
// such connections send (anyone can connect; an authenticated peer's drops
// and refusals are each logged). One daemon id
// holds one session at a time: a peer that dials in under an id whose
// session is live (outbound
// connections up, or inbound ones of the current epoch open) with another
// epoch is refused until that session is gone. Epochs are random, so a
// newer one cannot be told from an older one; refusing is the rule that
// never lets a second holder of the cluster key push a working peer out.
// A peer that restarted is accepted once its old connections have closed
// (at once when it exited; within peerKeepAlive's probes when its host
// vanished). A session this node dials itself, to the directory's address,
// adopts the epoch it is answered with.
//
// Tenants. An open request carries its Access: the segment's name, the
// tenant of the client that asks (on the asking daemon) and the tenant
// whose export it asks for. The owner's Exporter decides whether that
// tenant reaches the export (its own tenant's name, or an export that
// grants it), and the owner binds the access into the token under the
// same signature, so a token serves only the tenant it was issued to;
// every data request looks the export up again for the token's access,
// so an export that ends, or stops granting, ends the access. Refused
// requests are counted per peer and logged at most once per
// refuseLogEvery and reason.
//
// Compatibility across a rolling upgrade. The default tenant is left out
// of the protocol: an access without tenants is sent as the name alone
// and answered with a version 1 token, byte for byte as daemons before
// tenants do, so those daemons and these serve each other's default
// tenant as before. A request from such a daemon carries no tenant and is
// taken as the default tenant's. An access with tenants is sent in a form
// an older owner reads as a name it does not export (not found: it cannot
// check tenants, so it serves none), and is answered with a version 2
// token, which only this release reads.
package tcp
