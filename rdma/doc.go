// Package rdma is tensorcast's RDMA transport: RC queue pairs doing
// one-sided READ and WRITE over ibverbs.
//
// libibverbs is opened at run time (dlopen), never linked, so a binary built
// with cgo still starts on a host without it; Open then fails with
// ErrNoLibrary (which wraps xfer.ErrNotSupported) and the daemon runs with
// tcp only. Built without cgo, or off Linux, every constructor returns an
// error wrapping xfer.ErrNotSupported.
//
// The pieces, from the bottom:
//   - device discovery and RoCE v2 GID selection from sysfs (SelectGID),
//     with rdmamap for the device ↔ netdev map and port state;
//   - memory registration: a segment is registered once, in chunks
//     (Region), and its keys ride on the segment itself, in its RDMA slot
//     (Keys, xfer.SlotRDMA), so the hot path only looks ranges up;
//   - connection data (ConnInfo), a small binary struct the peer channel
//     carries, with INIT→RTR→RTS driven from it;
//   - the work-request plan (planner): tasks become linked lists of RDMA
//     READ/WRITE work requests with selective signalling;
//   - Transport, an xfer.Transport over a set of connected queue pairs with
//     one completion poller per completion queue;
//   - the verbs boundary under a Transport and a Region (QueuePair,
//     CompletionQueue, NewTransport, NewRegion): libibverbs implements it
//     in verbs_linux.go (its C side in verbs_linux.c), and package rdmatest
//     implements it in memory, so that the code above this package runs its
//     tests without a device.
//
// Package rdma/link builds the peer plane's RDMA side on this: one link
// per peer daemon over a Transport, and the registrations of the pools,
// client buffers and exports the links need.
//
// The transport's logic is tested over rdmatest (fabric_test.go); real
// verbs over Soft-RoCE inside a VM: make test-rdma.
package rdma
