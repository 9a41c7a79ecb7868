package main

import "runtime"

// spareProcs is how many Go processors the daemon runs beyond the CPUs it
// may use. Its event loops (the tcp peer plane's, on gnet) and its queue
// workers block in raw system calls (epoll_wait, futex), and a goroutine
// in a system call keeps its processor until the runtime's monitor takes it
// back, 20 us to 10 ms later. With exactly one processor per CPU, a
// goroutine made runnable while every processor is held that way waits
// for that: a runtime trace of the client's daemon during a 1 MiB tcp
// WRITE showed the peer connections' writers, woken together, starting
// 100-400 us after their wake-up while both CPUs idled. A spare processor
// runs such a goroutine at once; the CPUs stay shared by the kernel.
const spareProcs = 2

// procs is the GOMAXPROCS the daemon runs with: the runtime's choice (the
// CPUs it may use) plus spareProcs, unless the GOMAXPROCS environment
// variable sets it, which is kept as it is.
func procs(current int, env string) int {
	if env != "" {
		return current
	}
	return current + spareProcs
}

// setProcs applies procs and returns the value before and after.
func setProcs(getenv func(string) string) (before, after int) {
	before = runtime.GOMAXPROCS(0)
	after = procs(before, getenv("GOMAXPROCS"))
	if after != before {
		runtime.GOMAXPROCS(after)
	}
	return before, after
}
