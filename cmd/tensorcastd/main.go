// Command tensorcastd is the tensorcast data-plane daemon: it moves tensors
// and KV-cache blocks between colocated inference engines (unix socket +
// shared memory), local NVMe (io_uring) and other hosts' daemons.
//
// Usage: tensorcastd [--config FILE] [--socket PATH] [--data-dir DIR] [--pool-size SIZE] ...
// Every flag also has a TENSORCAST_* variable and a key in the config file;
// see deploy/tensorcastd.toml.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tensorcast/tensorcast/daemon"
)

func main() {
	os.Exit(run())
}

func run() int {
	cfg, err := daemon.Load(os.Args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tensorcastd:", err)
		return 2
	}
	log := daemon.NewLogger(cfg, os.Stderr, daemon.UnderJournal(os.Getenv, os.Stderr))
	if before, after := setProcs(os.Getenv, daemon.SyscallLoops(cfg)); after != before {
		log.Info("Go processors beyond the CPUs, one per goroutine that sleeps in a system call (GOMAXPROCS overrides)",
			"cpus", before, "gomaxprocs", after)
	}
	d, err := daemon.New(cfg, log, os.Getenv)
	if err != nil {
		log.Error("start-up failed", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := d.Run(ctx); err != nil {
		log.Error("shutdown", "err", err)
		return 1
	}
	return 0
}
