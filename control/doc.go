// Package control is tensorcastd's server of the client protocol. It owns:
//   - the unix-socket listener and its peer checks: which user a client is and
//     which tenant (pool, limits) that user belongs to (server.go, tenant.go);
//   - the framing of each connection, reads with the fds that come along
//     (conn.go, conn_linux.go);
//   - the handlers of the messages that package wire decodes: handlers.go
//     dispatches, audits and makes mutating calls idempotent by key (idem.go
//     holds the daemon-wide record); segments and pool blocks
//     (segment_handlers.go), batches and transfers (batch_handlers.go), peers
//     (peers.go), the store (store.go), the directory report (directory.go)
//     and Stats (stats.go);
//   - the workers that serve the queues clients open (queue.go, with the
//     store's queue calls in queue_store.go);
//   - the per-connection resources and their release (resources.go,
//     poolview.go, release.go).
//
// What it drives is passed in at construction (Deps): the transfer engine,
// the pools, the segment registry, the export table (package peer), the
// peer plane, the directory and the store.
package control
