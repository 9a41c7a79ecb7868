// Package link is the peer plane's RDMA side: one link per peer daemon
// and the memory registrations the links need.
//
// It owns:
//   - Links (links.go): the device, and the router's answer for a remote
//     target (Route): a peer's link when RDMA carries the request, else nil
//     for tcp;
//   - the pools' registrations (made once at start-up) and client
//     buffers', made off the submit path by a registration queue
//     (regs.go); each is kept as rdma.Keys in its segment's RDMA slot,
//     released by the segment's teardown or Close (locals.go);
//   - the link (link.go), a transport that splits a submission between the
//     rdma transport, the peer channel (notified WRITEs, notify.go) and
//     tcp; the worker goroutine that brings links up and retires them, and
//     resolves remote segments: the owner's keys of one go into the
//     remote segment's RDMA slot, where the router and the rdma transport
//     find them, until the link retires or the owner revokes them
//     (lifecycle.go);
//   - one registration per export a peer resolved, with the export's rights
//     as its remote access, revoked when the export ends (exports.go);
//   - the transport set per remote segment, kept on the segment (pins.go);
//   - what tcctl rdma and tcctl stats report (info.go, stats.go);
//   - the peer-channel exchanges these need: queue-pair connection data
//     (rdma.ExchangeKind), segment resolution, revocation and
//     notifications.
//
// Package peer/plane holds a Links when RDMA is usable and routes remote
// targets through it. It is tested without a device over rdmatest's
// in-memory fabric (the TestFabric* tests) and over real verbs in the
// Soft-RoCE VM (the TestVerbs* tests, make test-rdma).
package link
