// Command tcbench is tensorcast's fio-style benchmark harness: it runs jobs
// from INI job files or the command line as a client of tensorcastd and
// reports like fio, optionally side by side with a reference tool.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/tensorcast/tensorcast/bench"
)

const usage = `usage: tcbench [flags] [--name=JOB --option=value ...] [jobfile.fio ...]

Job options (fio's names; before the first --name they are global):
  engine=local|uring|tcp|rdma|store|mem  rw=read|write|randread|randwrite|randrw|rw
  rwmixread=N  bs=4k  bsrange=4k-64k  size=64m  io_size=4g  iodepth=N  batch=N  numjobs=N
  runtime=10s  time_based  ramp_time=2s  target=peer/segment  filename=PATH
  direct=1  verify=crc32c  randseed=N  daemon=SOCKET  stonewall  goal=TEXT
  metric=iops|bw|lat_p50 (what --baseline compares; default IOPS below 64k, else bw)
  peer_mem=pool|buffer (tcp/rdma: where both daemons keep the bytes; rdma: pool)

Flags:
  --output-format=normal|json|terse   --output=FILE   --plot=FILE.svg
  --spawn              start a private tensorcastd for the run (--daemon-bin, --pool-size);
                       tcp/rdma jobs get two connected daemons (--peer-host, default 127.0.0.1;
                       rdma: --rdma-device, --rdma-gid, which the perftest baseline uses too)
  --baseline           run the reference tool side by side (--repeat=N, A B A B ...)
  --dry-run            parse and print the jobs, run nothing
  --version  --help

tcbench summarize RESULT.json...   prints the Markdown benchmark table of
                                   --baseline --output-format=json results
`

func main() {
	if bench.ServePingPong() {
		return // this process was the far side of a ping-pong reference
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "summarize" {
		return summarize(args[1:], stdout, stderr)
	}
	opts, jobs, err := bench.ParseArgs(args)
	if err != nil {
		fmt.Fprintf(stderr, "tcbench: %v\n", err)
		if errors.Is(err, bench.ErrNoJobs) {
			fmt.Fprint(stderr, usage)
		}
		return 2
	}
	if opts.Help {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if opts.Version {
		fmt.Fprintln(stdout, bench.Version)
		return 0
	}
	if opts.DryRun {
		for _, j := range jobs {
			fmt.Fprintf(stdout, "%s: group=%d engine=%s rw=%s bs=%d-%d size=%d iodepth=%d batch=%d numjobs=%d runtime=%s time_based=%v (%s)\n",
				j.Name, j.Group, j.Engine, j.RW, j.BSMin, j.BSMax, j.Size, j.IODepth, j.Batch, j.NumJobs, j.Runtime, j.TimeBased, j.Src)
		}
		return 0
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	out := stdout
	if opts.Output != "" {
		f, err := os.Create(opts.Output)
		if err != nil {
			fmt.Fprintf(stderr, "tcbench: %v\n", err)
			return 1
		}
		defer f.Close()
		out = f
	}

	env := &bench.Env{Logger: log, RDMADevice: opts.RDMADevice, RDMAGID: opts.RDMAGID}
	var daemon *bench.Daemon
	var peers *bench.PeerPair
	if opts.Spawn {
		for _, j := range jobs {
			if err := bench.EngineAvailable(j.Engine); err != nil && !opts.Baseline {
				fmt.Fprintf(stderr, "tcbench: job %s: %v\n", j.Name, err)
				return 1
			}
		}
		if err := bench.SpawnCheck(jobs); err != nil {
			fmt.Fprintf(stderr, "tcbench: --spawn: %v\n", err)
			return 1
		}
		bin, err := bench.FindDaemonBin(opts.DaemonBin)
		if err != nil {
			fmt.Fprintf(stderr, "tcbench: %v\n", err)
			return 1
		}
		pool := opts.PoolSize
		if pool == 0 {
			pool = bench.PoolSizeFor(jobs)
		}
		if bench.NeedsOneDaemon(jobs) {
			daemon, err = bench.SpawnDaemon(bin, pool, bench.AllowedDirs(jobs), log)
			if err != nil {
				fmt.Fprintf(stderr, "tcbench: %v\n", err)
				return 1
			}
			env.Socket = daemon.Socket
		}
		if eng := bench.PeerEngineOf(jobs); eng != "" {
			rdma := "off"
			if eng == "rdma" {
				rdma = "on"
			}
			peers, err = bench.SpawnPeers(bench.PeerSpawn{Bin: bin, PoolSize: pool, Host: opts.PeerHost, RDMA: rdma,
				RDMADevice: opts.RDMADevice, RDMAGID: opts.RDMAGID, Jobs: jobs}, log)
			if err != nil {
				if daemon != nil {
					daemon.Stop()
				}
				fmt.Fprintf(stderr, "tcbench: --spawn engine=%s: %v\n", eng, err)
				return 1
			}
			peers.Env(env)
		}
	} else if err := bench.CheckTargets(jobs); err != nil {
		fmt.Fprintf(stderr, "tcbench: %v\n", err)
		return 2
	}
	var pw io.Writer
	if f, ok := stderr.(*os.File); ok {
		pw = bench.ProgressWriter(f)
	}
	r := &bench.Runner{Env: env, Logger: log, Progress: pw}

	code := 0
	var res *bench.Result
	var baselines []bench.BaselineResult
	if opts.Baseline {
		res = &bench.Result{}
		for _, j := range jobs {
			br, last, err := bench.RunBaseline(ctx, r, j, opts.Repeat)
			baselines = append(baselines, br)
			if err != nil {
				fmt.Fprintf(stderr, "tcbench: baseline %s: %v\n", j.Name, err)
				code = 1
			}
			if last != nil {
				if res.Start.IsZero() {
					res.Start = last.Start
				}
				for _, g := range last.Groups {
					g.ID = len(res.Groups)
					res.Groups = append(res.Groups, g)
				}
			}
		}
	} else {
		res, err = r.Run(ctx, jobs)
		if err != nil {
			fmt.Fprintf(stderr, "tcbench: %v\n", err)
			code = 1
		}
	}
	if peers != nil {
		if err := peers.Stop(); err != nil {
			fmt.Fprintf(stderr, "tcbench: %v\n", err)
			code = 1
		}
	}
	if daemon != nil {
		if err := daemon.Stop(); err != nil {
			fmt.Fprintf(stderr, "tcbench: %v\n", err)
			code = 1
		}
	}
	if res == nil {
		return code
	}
	if err := res.Err(); err != nil {
		fmt.Fprintf(stderr, "tcbench: %v\n", err)
		code = 1
	}
	switch opts.OutputFormat {
	case bench.FormatJSON:
		err = bench.WriteJSON(out, res, baselines)
	case bench.FormatTerse:
		err = bench.WriteTerse(out, res)
	default:
		err = bench.WriteNormal(out, res)
		if err == nil && len(baselines) > 0 {
			err = bench.WriteBaselineTable(out, baselines)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "tcbench: write report: %v\n", err)
		code = 1
	}
	if opts.Plot != "" {
		if err := writePlot(opts.Plot, res); err != nil {
			fmt.Fprintf(stderr, "tcbench: plot: %v\n", err)
			code = 1
		}
	}
	return code
}

func writePlot(path string, res *bench.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := bench.WritePlot(f, res); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// summarize prints the Markdown table of the baselines in JSON reports.
func summarize(files []string, stdout, stderr io.Writer) int {
	var all []bench.BaselineResult
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(stderr, "tcbench summarize: %v\n", err)
			return 1
		}
		var doc bench.FioOutput
		if err := json.Unmarshal(b, &doc); err != nil {
			fmt.Fprintf(stderr, "tcbench summarize: %s: %v\n", f, err)
			return 1
		}
		all = append(all, doc.Baselines...)
	}
	if err := bench.WriteBaselineMarkdown(stdout, all); err != nil {
		fmt.Fprintf(stderr, "tcbench summarize: %v\n", err)
		return 1
	}
	return 0
}
