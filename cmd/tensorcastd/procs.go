package main

import "runtime"

// procs is the GOMAXPROCS the daemon runs with: the runtime's choice (the
// CPUs it may use) plus one Go processor for each goroutine the daemon keeps
// asleep in a system call (blocked, from daemon.SyscallLoops), unless the
// GOMAXPROCS environment variable sets it, which is kept as it is.
//
// Its reactor workers (io_uring_enter, futex) and the tcp peer plane's event
// loops (epoll_wait) sleep in raw system calls, and a goroutine in a system
// call keeps its processor until the runtime's monitor takes it back, 20 µs
// to 10 ms later. While every processor is held that way, a goroutine made
// runnable waits for that: a runtime trace of the client's daemon during a
// 1 MiB tcp WRITE showed the peer connections' writers, woken together,
// starting 100-400 µs after their wake-up while both CPUs idled. Two spare
// processors were not enough for the six such goroutines of a two-CPU
// daemon with a peer plane: GOMAXPROCS=10 gave 1.32x the tcp 1 MiB write
// rate of the build with two (8 of 8 paired rounds, BENCHMARKS.md). A spare
// processor per sleeper runs such a goroutine at once; the CPUs stay shared
// by the kernel.
func procs(current int, env string, blocked int) int {
	if env != "" {
		return current
	}
	return current + blocked
}

// setProcs applies procs and returns the value before and after.
func setProcs(getenv func(string) string, blocked int) (before, after int) {
	before = runtime.GOMAXPROCS(0)
	after = procs(before, getenv("GOMAXPROCS"), blocked)
	if after != before {
		runtime.GOMAXPROCS(after)
	}
	return before, after
}
