// Package ktrace is tensorcastd's kernel-side view of its own traffic,
// from eBPF programs written in Go (cilium/ebpf's asm package; no C
// compiler at build time) and attached to raw tracepoints, which this
// kernel offers without tracefs:
//
//   - io_uring submit→complete latency per ring: io_uring_submit_req
//     stores the submit time under (ring, user_data) for this process's
//     rings; io_uring_complete finds it and counts the latency into a
//     per-ring log2 histogram (the same buckets as package loghist).
//   - TCP retransmits per connection: tcp_retransmit_skb counts per
//     4-tuple; the daemon names the tuples of its peer connections.
//
// The kernel structure fields the programs read (io_kiocb.ctx,
// io_kiocb.cqe.user_data, sock_common's addresses and ports) are found by
// name in /sys/kernel/btf/vmlinux when the programs are built, so one
// binary runs on kernels whose layouts differ.
//
// Loading needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN). Open reports a
// missing capability with ErrNoCapability and a missing hook (no BTF, no
// such tracepoint or field) with ErrNoHook, each naming what is missing.
//
// Lifecycle: Open loads and attaches; the kernel runs the programs from
// then on, in whatever context the tracepoints fire (no goroutine of this
// package is involved). Reads (Rings, Retransmits) walk the maps and may
// run concurrently. Close detaches the programs and frees the maps.
package ktrace
