package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Version is the harness version printed in reports ("fio version").
const Version = "tcbench-0.1"

// FioOutput mirrors fio's --output-format=json document for the fields
// tcbench fills (and reads back from fio for baselines). Extra fields fio
// prints are ignored when decoding; tcbench's additions are prefixed
// "tensorcast_".
type FioOutput struct {
	FioVersion    string            `json:"fio version"`
	Timestamp     int64             `json:"timestamp"`
	TimestampMs   int64             `json:"timestamp_ms"`
	Time          string            `json:"time"`
	GlobalOptions map[string]string `json:"global options,omitempty"`
	Jobs          []FioJob          `json:"jobs"`
	Groups        []FioJob          `json:"tensorcast_groups,omitempty"`
	Baselines     []BaselineResult  `json:"tensorcast_baselines,omitempty"`
}

// FioJob is one entry of fio's "jobs" array.
type FioJob struct {
	JobName    string            `json:"jobname"`
	GroupID    int               `json:"groupid"`
	Error      int               `json:"error"`
	ErrorText  string            `json:"tensorcast_error,omitempty"`
	Elapsed    int64             `json:"elapsed"`
	JobOptions map[string]string `json:"job options"`
	Read       FioDir            `json:"read"`
	Write      FioDir            `json:"write"`
	JobRuntime int64             `json:"job_runtime"`
}

// FioDir is fio's per-direction block ("read", "write").
type FioDir struct {
	IOBytes    uint64  `json:"io_bytes"`
	IOKBytes   uint64  `json:"io_kbytes"`
	BWBytes    uint64  `json:"bw_bytes"`
	BW         uint64  `json:"bw"` // KiB/s
	IOPS       float64 `json:"iops"`
	Runtime    int64   `json:"runtime"` // ms
	TotalIOs   uint64  `json:"total_ios"`
	ShortIOs   uint64  `json:"short_ios"`
	DropIOs    uint64  `json:"drop_ios"`
	SlatNs     FioLat  `json:"slat_ns"`
	ClatNs     FioLat  `json:"clat_ns"`
	LatNs      FioLat  `json:"lat_ns"`
	BWMin      uint64  `json:"bw_min"`
	BWMax      uint64  `json:"bw_max"`
	BWAgg      float64 `json:"bw_agg"`
	BWMean     float64 `json:"bw_mean"`
	BWDev      float64 `json:"bw_dev"`
	BWSamples  int     `json:"bw_samples"`
	IOPSMin    uint64  `json:"iops_min"`
	IOPSMax    uint64  `json:"iops_max"`
	IOPSMean   float64 `json:"iops_mean"`
	IOPSStddev float64 `json:"iops_stddev"`
	IOPSSample int     `json:"iops_samples"`
}

// FioLat is fio's latency block (slat_ns, clat_ns, lat_ns).
type FioLat struct {
	Min        uint64            `json:"min"`
	Max        uint64            `json:"max"`
	Mean       float64           `json:"mean"`
	Stddev     float64           `json:"stddev"`
	N          uint64            `json:"N"`
	Percentile map[string]uint64 `json:"percentile,omitempty"`
}

func pctKey(p float64) string { return strconv.FormatFloat(p, 'f', 6, 64) }

func fioLat(h *Histogram, pct bool) FioLat {
	l := FioLat{Min: h.Min(), Max: h.Max(), Mean: h.Mean(), Stddev: h.Stddev(), N: h.Count()}
	if pct && h.Count() > 0 {
		l.Percentile = make(map[string]uint64, len(Percentiles))
		for _, p := range Percentiles {
			l.Percentile[pctKey(p)] = h.Percentile(p)
		}
	}
	return l
}

// bwStats turns cumulative samples into per-interval KiB/s and IOPS figures.
func bwStats(samples []Sample, read bool, bs uint64) (bw []float64) {
	var prevT time.Duration
	var prev uint64
	for _, s := range samples {
		v := s.WriteBytes
		if read {
			v = s.ReadBytes
		}
		dt := (s.T - prevT).Seconds()
		if dt >= 0.01 {
			bw = append(bw, float64(v-min(v, prev))/dt/1024)
			prevT, prev = s.T, v
		}
	}
	return bw
}

func meanDev(v []float64) (mn, mx, mean, dev float64) {
	if len(v) == 0 {
		return
	}
	mn, mx = v[0], v[0]
	var s float64
	for _, x := range v {
		mn, mx = math.Min(mn, x), math.Max(mx, x)
		s += x
	}
	mean = s / float64(len(v))
	if len(v) > 1 {
		var q float64
		for _, x := range v {
			q += (x - mean) * (x - mean)
		}
		dev = math.Sqrt(q / float64(len(v)-1))
	}
	return
}

func fioDir(d *DirStats, runtime time.Duration, samples []Sample, read bool, bs uint64) FioDir {
	f := FioDir{IOBytes: d.Bytes, IOKBytes: d.Bytes / 1024, TotalIOs: d.IOs, DropIOs: d.Errors,
		Runtime: runtime.Milliseconds()}
	if d.IOs == 0 {
		return f
	}
	if sec := runtime.Seconds(); sec > 0 {
		f.BWBytes = uint64(float64(d.Bytes) / sec)
		f.BW = f.BWBytes / 1024
		f.IOPS = float64(d.IOs) / sec
	}
	f.SlatNs = fioLat(&d.Slat, false)
	f.ClatNs = fioLat(&d.Clat, true)
	f.LatNs = fioLat(&d.Lat, true)
	bw := bwStats(samples, read, bs)
	mn, mx, mean, dev := meanDev(bw)
	f.BWMin, f.BWMax, f.BWMean, f.BWDev, f.BWSamples = uint64(mn), uint64(mx), mean, dev, len(bw)
	f.BWAgg = 100
	if bs > 0 {
		f.IOPSMin, f.IOPSMax = uint64(mn*1024/float64(bs)), uint64(mx*1024/float64(bs))
		f.IOPSMean, f.IOPSStddev, f.IOPSSample = mean*1024/float64(bs), dev*1024/float64(bs), len(bw)
	}
	return f
}

func jobOptions(j *Job) map[string]string {
	m := map[string]string{
		"engine":   j.Engine,
		"rw":       j.RW.String(),
		"bs":       strconv.FormatUint(j.BSMin, 10),
		"size":     strconv.FormatUint(j.Size, 10),
		"iodepth":  strconv.Itoa(j.IODepth),
		"batch":    strconv.Itoa(j.Batch),
		"numjobs":  strconv.Itoa(j.NumJobs),
		"randseed": strconv.FormatUint(j.RandSeed, 10),
	}
	if j.BSMax != j.BSMin {
		m["bsrange"] = fmt.Sprintf("%d-%d", j.BSMin, j.BSMax)
	}
	if j.RW == RWRandRW || j.RW == RWReadWrite {
		m["rwmixread"] = strconv.Itoa(j.RWMixRead)
	}
	if j.Runtime > 0 {
		m["runtime"] = j.Runtime.String()
	}
	if j.TimeBased {
		m["time_based"] = "1"
	}
	if j.RampTime > 0 {
		m["ramp_time"] = j.RampTime.String()
	}
	if j.Filename != "" {
		m["filename"] = j.Filename
	}
	if j.Target != "" {
		m["target"] = j.Target
	}
	if j.Direct {
		m["direct"] = "1"
	}
	if j.Verify != "" {
		m["verify"] = j.Verify
	}
	return m
}

// JSONReport builds fio's JSON document for a run.
func JSONReport(res *Result, baselines []BaselineResult) *FioOutput {
	out := &FioOutput{FioVersion: Version, Timestamp: res.Start.Unix(), TimestampMs: res.Start.UnixMilli(),
		Time: res.Start.Format(time.ANSIC), Baselines: baselines}
	for _, g := range res.Groups {
		var gj FioJob
		for _, jr := range g.Jobs {
			fj := FioJob{JobName: jr.Job.Name, GroupID: g.ID, Elapsed: int64(jr.Runtime.Seconds()),
				JobOptions: jobOptions(jr.Job), JobRuntime: jr.Runtime.Milliseconds(),
				Read:  fioDir(&jr.Read, jr.Runtime, jr.Samples, true, jr.Job.BSMin),
				Write: fioDir(&jr.Write, jr.Runtime, jr.Samples, false, jr.Job.BSMin)}
			if jr.Err != nil {
				fj.Error, fj.ErrorText = 1, jr.Err.Error()
			}
			out.Jobs = append(out.Jobs, fj)
		}
		gj = FioJob{JobName: fmt.Sprintf("group %d", g.ID), GroupID: g.ID, Elapsed: int64(g.Runtime.Seconds()),
			JobRuntime: g.Runtime.Milliseconds(),
			Read:       fioDir(&g.Read, g.Runtime, nil, true, 0),
			Write:      fioDir(&g.Write, g.Runtime, nil, false, 0)}
		out.Groups = append(out.Groups, gj)
	}
	return out
}

// WriteJSON writes the JSON report.
func WriteJSON(w io.Writer, res *Result, baselines []BaselineResult) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(JSONReport(res, baselines))
}

// latUnit picks fio's unit for a latency block.
func latUnit(h *Histogram) (string, float64) {
	switch {
	case h.Max() >= 10_000_000:
		return "msec", 1e6
	case h.Max() >= 10_000:
		return "usec", 1e3
	}
	return "nsec", 1
}

func writeDirNormal(w io.Writer, name string, d *DirStats, runtime time.Duration) {
	if d.IOs == 0 && d.Errors == 0 {
		return
	}
	sec := runtime.Seconds()
	var bw, iops float64
	if sec > 0 {
		bw, iops = float64(d.Bytes)/sec, float64(d.IOs)/sec
	}
	fmt.Fprintf(w, "  %s: IOPS=%s, BW=%s/s (%s/s)(%s/%dmsec)\n", name, siCount(iops), humanBytes(bw), siBytes(bw),
		humanBytes(float64(d.Bytes)), runtime.Milliseconds())
	for _, l := range []struct {
		n string
		h *Histogram
	}{{"slat", &d.Slat}, {"clat", &d.Clat}, {" lat", &d.Lat}} {
		if l.h.Count() == 0 {
			continue
		}
		u, div := latUnit(l.h)
		fmt.Fprintf(w, "    %s (%s): min=%s, max=%s, avg=%s, stdev=%s\n", l.n, u,
			num(float64(l.h.Min())/div), num(float64(l.h.Max())/div), num(l.h.Mean()/div), num(l.h.Stddev()/div))
	}
	if d.Clat.Count() > 0 {
		u, div := latUnit(&d.Clat)
		fmt.Fprintf(w, "    clat percentiles (%s):\n", u)
		for i, p := range Percentiles {
			if i%4 == 0 {
				fmt.Fprint(w, "     |")
			}
			fmt.Fprintf(w, " %6.2fth=[%s]", p, num(float64(d.Clat.Percentile(p))/div))
			if i%4 == 3 || i == len(Percentiles)-1 {
				fmt.Fprintln(w)
			} else {
				fmt.Fprint(w, ",")
			}
		}
	}
	if d.Errors > 0 {
		fmt.Fprintf(w, "    errors=%d\n", d.Errors)
	}
}

// WriteNormal writes fio's human report: per job, then per group.
func WriteNormal(w io.Writer, res *Result) error {
	for _, g := range res.Groups {
		for _, jr := range g.Jobs {
			errno := 0
			if jr.Err != nil {
				errno = 1
			}
			fmt.Fprintf(w, "%s: (groupid=%d, jobs=1): err=%2d: clone=%d engine=%s rw=%s bs=%s iodepth=%d batch=%d\n",
				jr.Job.Name, g.ID, errno, jr.Clone, jr.Job.Engine, jr.Job.RW, bsString(jr.Job), jr.Job.IODepth, jr.Job.Batch)
			if jr.Err != nil {
				fmt.Fprintf(w, "  error: %v\n", jr.Err)
			}
			writeDirNormal(w, "read", &jr.Read, jr.Runtime)
			writeDirNormal(w, "write", &jr.Write, jr.Runtime)
		}
		fmt.Fprintf(w, "\nRun status group %d (all jobs):\n", g.ID)
		for _, d := range []struct {
			n string
			s *DirStats
		}{{"READ", &g.Read}, {"WRITE", &g.Write}} {
			if d.s.IOs == 0 {
				continue
			}
			var lo, hi float64 = math.MaxFloat64, 0
			var rlo, rhi time.Duration = time.Duration(math.MaxInt64), 0
			for _, jr := range g.Jobs {
				s := &jr.Read
				if d.n == "WRITE" {
					s = &jr.Write
				}
				if s.IOs == 0 {
					continue
				}
				if jr.Runtime > 0 {
					b := float64(s.Bytes) / jr.Runtime.Seconds()
					lo, hi = math.Min(lo, b), math.Max(hi, b)
				}
				rlo, rhi = min(rlo, jr.Runtime), max(rhi, jr.Runtime)
			}
			agg := 0.0
			if g.Runtime > 0 {
				agg = float64(d.s.Bytes) / g.Runtime.Seconds()
			}
			fmt.Fprintf(w, "  %5s: bw=%s/s (%s/s), %s/s-%s/s (%s/s-%s/s), io=%s (%s), run=%d-%dmsec\n", d.n,
				humanBytes(agg), siBytes(agg), humanBytes(lo), humanBytes(hi), siBytes(lo), siBytes(hi),
				humanBytes(float64(d.s.Bytes)), siBytes(float64(d.s.Bytes)), rlo.Milliseconds(), rhi.Milliseconds())
		}
		fmt.Fprintln(w)
	}
	return nil
}

func bsString(j *Job) string {
	if j.BSMin == j.BSMax {
		return humanBytes(float64(j.BSMin))
	}
	return humanBytes(float64(j.BSMin)) + "-" + humanBytes(float64(j.BSMax))
}

func num(v float64) string {
	if v >= 100 || v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func siCount(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func siBytes(v float64) string {
	return scaledBytes(v, 1000, []string{"B", "kB", "MB", "GB", "TB", "PB"})
}

// WriteTerse writes one semicolon-separated line per job clone. Fields:
// "tc1";version;jobname;groupid;error; then for read and then write:
// io_kbytes;bw_kib;iops;runtime_ms; slat min;max;mean;stddev (usec);
// clat min;max;mean;stddev (usec); the 17 clat percentiles as "P%=usec";
// lat min;max;mean;stddev (usec); bw min;max;agg%;mean;stddev (KiB/s).
func WriteTerse(w io.Writer, res *Result) error {
	doc := JSONReport(res, nil)
	for _, j := range doc.Jobs {
		f := []string{"tc1", Version, j.JobName, strconv.Itoa(j.GroupID), strconv.Itoa(j.Error)}
		for _, d := range []*FioDir{&j.Read, &j.Write} {
			f = append(f, strconv.FormatUint(d.IOKBytes, 10), strconv.FormatUint(d.BW, 10),
				strconv.FormatFloat(d.IOPS, 'f', 0, 64), strconv.FormatInt(d.Runtime, 10))
			f = append(f, terseLat(d.SlatNs)...)
			f = append(f, terseLat(d.ClatNs)...)
			keys := make([]string, 0, len(Percentiles))
			for _, p := range Percentiles {
				keys = append(keys, fmt.Sprintf("%s%%=%d", strconv.FormatFloat(p, 'f', -1, 64), d.ClatNs.Percentile[pctKey(p)]/1000))
			}
			f = append(f, keys...)
			f = append(f, terseLat(d.LatNs)...)
			f = append(f, strconv.FormatUint(d.BWMin, 10), strconv.FormatUint(d.BWMax, 10),
				strconv.FormatFloat(d.BWAgg, 'f', 2, 64), strconv.FormatFloat(d.BWMean, 'f', 2, 64),
				strconv.FormatFloat(d.BWDev, 'f', 2, 64))
		}
		if _, err := fmt.Fprintln(w, strings.Join(f, ";")); err != nil {
			return err
		}
	}
	return nil
}

func terseLat(l FioLat) []string {
	return []string{strconv.FormatUint(l.Min/1000, 10), strconv.FormatUint(l.Max/1000, 10),
		strconv.FormatFloat(l.Mean/1000, 'f', 2, 64), strconv.FormatFloat(l.Stddev/1000, 'f', 2, 64)}
}

// median of v (v is reordered).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
