package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// BaselineResult is a job and its reference tool run side by side,
// alternating tensorcast and reference runs; figures are per run.
type BaselineResult struct {
	Job              string    `json:"job"`
	Engine           string    `json:"engine"`
	Reference        string    `json:"reference"`
	Metric           string    `json:"metric"` // "bw_bytes", "iops" or "lat_p50" (ns; the ratio is then lower-is-better)
	Goal             string    `json:"goal,omitempty"`
	Tensorcast       []float64 `json:"tensorcast_runs"`
	Ref              []float64 `json:"reference_runs"`
	TensorcastMedian float64   `json:"tensorcast_median"`
	ReferenceMedian  float64   `json:"reference_median"`
	Ratio            float64   `json:"ratio"`
	Command          string    `json:"reference_command"`
	Error            string    `json:"error,omitempty"`
}

// metricOf says what a job is judged by: IOPS below 64 KiB blocks,
// bandwidth from there.
func metricOf(j *Job) string {
	if j.Metric != "" {
		return j.Metric
	}
	if j.BSMax < 64<<10 {
		return "iops"
	}
	return "bw_bytes"
}

// ToolMissing is the error for a reference tool that is not installed.
func ToolMissing(tool string) error {
	return fmt.Errorf("%w: %s is not installed (`make deps` installs it)", ErrToolMissing, tool)
}

// reference runs the reference tool once for j and returns its figure for
// metric.
type reference struct {
	name    string
	command string
	run     func(ctx context.Context) (float64, error)
}

func referenceFor(env *Env, j *Job, metric string) (*reference, error) {
	switch j.Engine {
	case "local", "mem":
		if metric == "lat_p50" {
			return pingPongRef("unix", j, metric), nil
		}
		return &reference{name: "memcpy (in-process copy() loop)", command: "in-process copy() of bs-sized chunks",
			run: func(ctx context.Context) (float64, error) {
				bw, iops, err := MemcpyLoop(ctx, j)
				if err != nil {
					return 0, err
				}
				if metric == "iops" {
					return iops, nil
				}
				return bw, nil
			}}, nil
	case "uring":
		if _, err := exec.LookPath("fio"); err != nil {
			return nil, ToolMissing("fio")
		}
		args := FioArgs(j)
		return &reference{name: "fio io_uring", command: "fio " + strings.Join(args, " "),
			run: func(ctx context.Context) (float64, error) {
				out, err := RunFio(ctx, args)
				if err != nil {
					return 0, err
				}
				return fioFigure(out, metric)
			}}, nil
	case "tcp":
		if j.IODepth == 1 && (metric == "lat_p50" || j.BSMax < 64<<10) {
			// One request at a time is a round trip: the reference is a
			// raw socket doing the same.
			return pingPongRef("tcp", j, metric), nil
		}
		if _, err := exec.LookPath("iperf3"); err != nil {
			return nil, ToolMissing("iperf3")
		}
		secs := max(1, int(j.Runtime/time.Second))
		// As many streams as the daemons open per peer (peer_conns): the
		// clones share them.
		streams := DaemonPeerConns
		// iperf3 writes at most MaxIperf3Length bytes per call.
		length := min(j.BSMax, MaxIperf3Length)
		return &reference{name: fmt.Sprintf("iperf3 -P %d (the daemons' %d connections per peer)", streams, DaemonPeerConns),
			command: fmt.Sprintf("iperf3 -c 127.0.0.1 -t %d -l %d -P %d -J", secs, length, streams),
			run: func(ctx context.Context) (float64, error) {
				bps, err := RunIperf3(ctx, secs, length, streams)
				if metric == "iops" {
					// Messages of bs bytes per second: a streaming
					// bound, not round trips.
					return bps / 8 / float64(j.BSMax), err
				}
				return bps / 8, err
			}}, nil
	case "rdma":
		tool := "ib_write_bw"
		if j.RW.Reads() {
			tool = "ib_read_bw"
		}
		if _, err := exec.LookPath(tool); err != nil {
			return nil, ToolMissing(tool + " (perftest)")
		}
		secs := max(1, int(j.Runtime/time.Second))
		dev, where := perftestDevice(env), "first RDMA device"
		if len(dev) > 0 {
			where = strings.Join(dev, " ")
		}
		return &reference{name: tool + " (perftest, " + where + ")",
			command: strings.Join(append(append([]string{tool}, dev...),
				"-s", strconv.FormatUint(j.BSMax, 10), "-D", strconv.Itoa(secs), "--report_gbits", "127.0.0.1"), " "),
			run: func(ctx context.Context) (float64, error) {
				gbps, err := RunPerftest(ctx, tool, secs, j.BSMax, dev...)
				if metric == "iops" {
					return gbps * 1e9 / 8 / float64(j.BSMax), err
				}
				return gbps * 1e9 / 8, err
			}}, nil
	}
	return nil, fmt.Errorf("%w: no reference tool for engine %s", ErrEngineUnavailable, j.Engine)
}

// RunBaseline runs j and its reference alternately, repeat times each
// (A B A B ...), and returns both medians and their ratio.
// The last tensorcast run's result comes back for the report.
func RunBaseline(ctx context.Context, r *Runner, j *Job, repeat int) (BaselineResult, *Result, error) {
	metric := metricOf(j)
	br := BaselineResult{Job: j.Name, Engine: j.Engine, Metric: metric, Goal: j.Goal}
	if err := EngineAvailable(j.Engine); err != nil {
		br.Error = err.Error()
		return br, nil, err
	}
	ref, err := referenceFor(r.Env, j, metric)
	if err != nil {
		br.Error = err.Error()
		return br, nil, err
	}
	var last *Result
	br.Reference, br.Command = ref.name, ref.command
	one := *j
	one.Group = 0
	for i := 0; i < repeat; i++ {
		res, err := r.Run(ctx, []*Job{&one})
		if err == nil {
			err = res.Err()
		}
		if err != nil {
			br.Error = err.Error()
			return br, res, err
		}
		last = res
		g := res.Groups[0]
		sec := g.Runtime.Seconds()
		v := 0.0
		switch {
		case metric == "lat_p50":
			var h Histogram
			h.Merge(&g.Read.Lat)
			h.Merge(&g.Write.Lat)
			v = float64(h.Percentile(50))
		case sec <= 0:
		case metric == "iops":
			v = float64(g.Read.IOs+g.Write.IOs) / sec
		default:
			v = float64(g.Read.Bytes+g.Write.Bytes) / sec
		}
		br.Tensorcast = append(br.Tensorcast, v)
		rv, err := ref.run(ctx)
		if err != nil {
			br.Error = err.Error()
			return br, last, err
		}
		br.Ref = append(br.Ref, rv)
	}
	br.TensorcastMedian = median(append([]float64(nil), br.Tensorcast...))
	br.ReferenceMedian = median(append([]float64(nil), br.Ref...))
	if br.ReferenceMedian > 0 {
		br.Ratio = br.TensorcastMedian / br.ReferenceMedian
	}
	return br, last, nil
}

// pingPongRef is a raw socket ping-pong of bs bytes between two processes
// (PingPong), for the job's runtime: round trips per second, or their p50.
func pingPongRef(network string, j *Job, metric string) *reference {
	d := max(j.Runtime, time.Second)
	name := "unix-socket ping-pong between two processes"
	if network == "tcp" {
		name = "raw TCP ping-pong between two processes (loopback, TCP_NODELAY)"
	}
	return &reference{name: name, command: fmt.Sprintf("tcbench's %s ping-pong, %d bytes each way, %v", network, j.BSMax, d),
		run: func(ctx context.Context) (float64, error) {
			rate, h, err := PingPong(ctx, network, j.BSMax, d)
			if err != nil {
				return 0, err
			}
			if metric == "lat_p50" {
				return float64(h.Percentile(50)), nil
			}
			return rate, nil
		}}
}

// MemcpyLoop is the local engine's reference: numjobs goroutines each copy
// bs-sized chunks between a region of size bytes and one bs buffer (region
// → buffer for reads, buffer → region for writes), for the job's runtime or
// one pass of size bytes. It returns bytes/s and copies/s.
func MemcpyLoop(ctx context.Context, j *Job) (bw, iops float64, err error) {
	if j.Size*uint64(j.NumJobs) > MaxMemRegion {
		return 0, 0, fmt.Errorf("%w: memcpy reference needs %d bytes of memory, more than %d", ErrBadValue, j.Size*uint64(j.NumJobs), uint64(MaxMemRegion))
	}
	var wg sync.WaitGroup
	bytesDone := make([]uint64, j.NumJobs)
	regions := make([][]byte, j.NumJobs)
	for c := range regions {
		// Real bytes, not the shared zero page an untouched region reads as.
		regions[c] = make([]byte, j.Size)
		fillPattern(regions[c], j.RandSeed, 0)
	}
	start := time.Now()
	for c := 0; c < j.NumJobs; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			region := regions[c]
			// The buffer too: a fresh one reads as the shared zero page,
			// which is always in cache and makes writes look faster.
			buf := make([]byte, j.BSMax)
			fillPattern(buf, j.RandSeed+1, 0)
			bs := j.BSMax
			deadline := start.Add(j.Runtime)
			var done uint64
			off := uint64(0)
			for iter := 0; ; iter++ {
				if off+bs > j.Size {
					off = 0
				}
				if j.RW.Reads() {
					copy(buf, region[off:off+bs])
				} else {
					copy(region[off:off+bs], buf)
				}
				off += bs
				done += bs
				if iter&63 == 63 && ctx.Err() != nil {
					break
				}
				if j.Runtime > 0 {
					if iter&15 == 15 && time.Now().After(deadline) {
						break
					}
				} else if done >= j.Size {
					break
				}
			}
			bytesDone[c] = done
		}()
	}
	wg.Wait()
	sec := time.Since(start).Seconds()
	var total uint64
	for _, b := range bytesDone {
		total += b
	}
	if sec <= 0 {
		return 0, 0, nil
	}
	return float64(total) / sec, float64(total/j.BSMax) / sec, nil
}

// FioArgs is the fio command line that mirrors j with ioengine=io_uring.
func FioArgs(j *Job) []string {
	rw := j.RW.String()
	args := []string{"--output-format=json", "--name=" + j.Name, "--ioengine=io_uring", "--filename=" + j.Filename,
		"--rw=" + rw, "--iodepth=" + strconv.Itoa(j.IODepth), "--size=" + strconv.FormatUint(j.Size, 10),
		"--numjobs=" + strconv.Itoa(j.NumJobs), "--group_reporting", "--randseed=" + strconv.FormatUint(j.RandSeed, 10)}
	if j.BSMin == j.BSMax {
		args = append(args, "--bs="+strconv.FormatUint(j.BSMin, 10))
	} else {
		args = append(args, fmt.Sprintf("--bsrange=%d-%d", j.BSMin, j.BSMax))
	}
	if j.Direct {
		args = append(args, "--direct=1")
	}
	if j.Batch > 1 {
		// tcbench submits batch requests at once and reaps them as a whole.
		args = append(args, "--iodepth_batch_submit="+strconv.Itoa(j.Batch),
			"--iodepth_batch_complete_min="+strconv.Itoa(j.Batch))
	}
	if j.RW == RWRandRW || j.RW == RWReadWrite {
		args = append(args, "--rwmixread="+strconv.Itoa(j.RWMixRead))
	}
	if j.Runtime > 0 {
		args = append(args, fmt.Sprintf("--runtime=%dms", j.Runtime.Milliseconds()))
	}
	if j.TimeBased {
		args = append(args, "--time_based")
	}
	if j.RampTime > 0 {
		args = append(args, fmt.Sprintf("--ramp_time=%dms", j.RampTime.Milliseconds()))
	}
	return args
}

// RunFio runs fio with args (which must ask for JSON) and decodes its report.
func RunFio(ctx context.Context, args []string) (*FioOutput, error) {
	cmd := exec.CommandContext(ctx, "fio", args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%w: fio: %w: %s", ErrToolOutput, err, strings.TrimSpace(stderr.String()))
	}
	return ParseFioJSON(out.Bytes())
}

// ParseFioJSON decodes fio's JSON report; text fio prints before the
// document (notes, warnings) is skipped.
func ParseFioJSON(b []byte) (*FioOutput, error) {
	i := bytes.IndexByte(b, '{')
	if i < 0 {
		return nil, fmt.Errorf("%w: no JSON document in fio's output", ErrToolOutput)
	}
	var out FioOutput
	if err := json.Unmarshal(b[i:], &out); err != nil {
		return nil, fmt.Errorf("%w: fio JSON: %w", ErrToolOutput, err)
	}
	if len(out.Jobs) == 0 {
		return nil, fmt.Errorf("%w: fio JSON has no jobs", ErrToolOutput)
	}
	return &out, nil
}

func fioFigure(out *FioOutput, metric string) (float64, error) {
	var v float64
	for _, j := range out.Jobs {
		if j.Error != 0 {
			return 0, fmt.Errorf("%w: fio job %s ended with error %d", ErrToolOutput, j.JobName, j.Error)
		}
		if metric == "iops" {
			v += j.Read.IOPS + j.Write.IOPS
		} else {
			v += float64(j.Read.BWBytes + j.Write.BWBytes)
		}
	}
	return v, nil
}

// Iperf3Output is the part of `iperf3 -J` tcbench reads.
type Iperf3Output struct {
	End struct {
		SumSent struct {
			Bytes         uint64  `json:"bytes"`
			Seconds       float64 `json:"seconds"`
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_sent"`
		SumReceived struct {
			Bytes         uint64  `json:"bytes"`
			Seconds       float64 `json:"seconds"`
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

// ParseIperf3JSON decodes `iperf3 -J` and returns the received bits/s.
func ParseIperf3JSON(b []byte) (float64, error) {
	var out Iperf3Output
	if err := json.Unmarshal(b, &out); err != nil {
		return 0, fmt.Errorf("%w: iperf3 JSON: %w", ErrToolOutput, err)
	}
	if out.Error != "" {
		return 0, fmt.Errorf("%w: iperf3: %s", ErrToolOutput, out.Error)
	}
	if out.End.SumReceived.BitsPerSecond <= 0 {
		return 0, fmt.Errorf("%w: iperf3 JSON has no received bandwidth", ErrToolOutput)
	}
	return out.End.SumReceived.BitsPerSecond, nil
}

// freeLoopbackPort is a tcp port on 127.0.0.1 that was free a moment ago,
// for a reference tool's one-off server.
func freeLoopbackPort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}

// MaxIperf3Length is the largest -l iperf3 accepts.
const MaxIperf3Length = 1 << 20

// RunIperf3 runs a one-off iperf3 server and a client against it on
// loopback, and returns the received bits/s.
func RunIperf3(ctx context.Context, secs int, length uint64, streams int) (float64, error) {
	port, err := freeLoopbackPort()
	if err != nil {
		return 0, err
	}
	srv := exec.CommandContext(ctx, "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", port)
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("%w: iperf3 server: %w", ErrToolOutput, err)
	}
	defer func() {
		srv.Process.Kill()
		srv.Wait()
	}()
	args := []string{"-c", "127.0.0.1", "-p", port, "-t", strconv.Itoa(secs), "-l", strconv.FormatUint(length, 10),
		"-P", strconv.Itoa(streams), "-J"}
	var lastErr error
	for attempt := 0; attempt < 50; attempt++ {
		// The server may not listen yet: retry while the client cannot connect.
		out, err := exec.CommandContext(ctx, "iperf3", args...).Output()
		bps, perr := ParseIperf3JSON(out)
		if perr == nil {
			return bps, nil
		}
		lastErr = perr
		if err == nil && !strings.Contains(perr.Error(), "connect") {
			return 0, perr
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0, fmt.Errorf("%w: iperf3 client: %w", ErrToolOutput, lastErr)
}

func fmtFigure(metric string, v float64) string {
	switch metric {
	case "iops":
		return siCount(v) + " IOPS"
	case "lat_p50":
		return fmt.Sprintf("p50 %.1f µs", v/1e3)
	}
	return humanBytes(v) + "/s"
}

// WriteBaselineTable prints the side-by-side medians.
func WriteBaselineTable(w io.Writer, bs []BaselineResult) error {
	fmt.Fprintf(w, "Baselines (median of %s runs each, alternating):\n", runsOf(bs))
	fmt.Fprintf(w, "  %-20s %-8s %-16s %-16s %-8s %s\n", "job", "engine", "tensorcast", "reference", "ratio", "reference tool")
	for _, b := range bs {
		if b.Error != "" {
			fmt.Fprintf(w, "  %-20s %-8s error: %s\n", b.Job, b.Engine, b.Error)
			continue
		}
		fmt.Fprintf(w, "  %-20s %-8s %-16s %-16s %-8.3f %s\n", b.Job, b.Engine, fmtFigure(b.Metric, b.TensorcastMedian),
			fmtFigure(b.Metric, b.ReferenceMedian), b.Ratio, b.Reference)
	}
	return nil
}

func runsOf(bs []BaselineResult) string {
	for _, b := range bs {
		if len(b.Tensorcast) > 0 {
			return strconv.Itoa(len(b.Tensorcast))
		}
	}
	return "0"
}

// WriteBaselineMarkdown prints the benchmark table (job, tensorcast median,
// reference median, ratio, goal) from baseline results, as Markdown.
func WriteBaselineMarkdown(w io.Writer, bs []BaselineResult) error {
	fmt.Fprintln(w, "| job | engine | tensorcast (median) | reference (median) | ratio | goal | reference tool |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, b := range bs {
		goal := b.Goal
		if goal == "" {
			goal = "–"
		}
		if b.Error != "" {
			fmt.Fprintf(w, "| %s | %s | not run: %s | | | %s | %s |\n", b.Job, b.Engine, mdEscape(b.Error), mdEscape(goal), mdEscape(b.Reference))
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.3f | %s | %s |\n", b.Job, b.Engine, fmtFigure(b.Metric, b.TensorcastMedian),
			fmtFigure(b.Metric, b.ReferenceMedian), b.Ratio, mdEscape(goal), mdEscape(b.Reference))
	}
	return nil
}

func mdEscape(s string) string {
	return strings.NewReplacer("|", "\\|", "\n", " ").Replace(s)
}

// perftestDevice is perftest's device and GID flags for env's --rdma-device
// and --rdma-gid (-x takes an index only; a GID address is left to it).
func perftestDevice(env *Env) []string {
	var a []string
	if env == nil {
		return nil
	}
	if env.RDMADevice != "" {
		a = append(a, "-d", env.RDMADevice)
	}
	if _, err := strconv.ParseUint(env.RDMAGID, 10, 8); err == nil {
		a = append(a, "-x", env.RDMAGID)
	}
	return a
}

// RunPerftest runs a perftest bandwidth tool (ib_write_bw, ib_read_bw) as a
// one-off server and a client against it over loopback (the RDMA itself
// goes through the device dev names, -d and -x, else the first one), and
// returns the average Gbit/s.
func RunPerftest(ctx context.Context, tool string, secs int, size uint64, dev ...string) (float64, error) {
	port, err := freeLoopbackPort()
	if err != nil {
		return 0, err
	}
	common := append(append([]string(nil), dev...), "-s", strconv.FormatUint(size, 10), "-D", strconv.Itoa(secs), "--report_gbits", "-p", port)
	var srvOut bytes.Buffer
	srv := exec.CommandContext(ctx, tool, common...)
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("%w: %s server: %w", ErrToolOutput, tool, err)
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()
	defer func() {
		srv.Process.Kill()
		<-srvDone
	}()
	var lastErr error
	for attempt := 0; attempt < 50; attempt++ {
		select {
		case err := <-srvDone:
			srvDone <- err
			return 0, fmt.Errorf("%w: %s server exited (%v): %s", ErrToolOutput, tool, err, strings.TrimSpace(srvOut.String()))
		default:
		}
		out, err := exec.CommandContext(ctx, tool, append(common, "127.0.0.1")...).CombinedOutput()
		gbps, perr := ParsePerftest(out)
		if perr == nil {
			return gbps, nil
		}
		lastErr = fmt.Errorf("%w (exit: %v)", perr, err)
		if !strings.Contains(string(out), "connect") {
			return 0, lastErr
		}
		time.Sleep(50 * time.Millisecond)
	}
	return 0, lastErr
}

// ParsePerftest reads the result line of a perftest bandwidth tool run
// with --report_gbits ("#bytes #iterations BW peak BW average MsgRate") and
// returns the average Gbit/s.
func ParsePerftest(out []byte) (float64, error) {
	lines := strings.Split(string(out), "\n")
	for i, line := range lines {
		if !strings.Contains(line, "BW average[Gb/sec]") || i+1 >= len(lines) {
			continue
		}
		f := strings.Fields(lines[i+1])
		if len(f) < 4 {
			break
		}
		v, err := strconv.ParseFloat(f[3], 64)
		if err != nil || v <= 0 {
			break
		}
		return v, nil
	}
	msg := strings.TrimSpace(string(out))
	if len(msg) > 300 {
		msg = msg[len(msg)-300:]
	}
	return 0, fmt.Errorf("%w: perftest printed no Gb/sec result: %s", ErrToolOutput, msg)
}
