// Package control is tensorcastd's server of the client protocol. It owns:
//   - the unix-socket listener and its peer checks: which user a client is and
//     which tenant (pool, limits) that user belongs to (server.go, tenant.go);
//   - the framing of each connection, reads with the fds that come along
//     (conn.go, conn_linux.go);
//   - the dispatch of the messages that package wire decodes to the
//     connection's session (package session: what the client holds, and
//     the data plane it drives), with the audit of mutating calls and
//     their idempotency by key (handlers.go; idem.go holds the daemon-wide
//     record);
//   - the daemon-wide calls: Hello, Stats (stats.go), peers, RDMA and
//     segments (peerinfo.go) and the directory report (directory.go).
//
// What it serves from is passed in at construction (Deps): the transfer
// engine, the pools, the segment registry, the export table (package
// peer), the peer plane, the directory and the store; the sessions get
// theirs through a session.Host.
package control
