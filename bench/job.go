// Package bench is tcbench's harness: fio-style job files and command lines,
// a runner that keeps iodepth requests in flight through a small engine
// interface, latency histograms, reports (normal, json, terse), plots and
// side-by-side baselines against the reference tools.
package bench

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// RW is a job's access pattern.
type RW uint8

const (
	RWRead RW = iota + 1
	RWWrite
	RWRandRead
	RWRandWrite
	RWRandRW
	RWReadWrite // sequential mixed read/write
)

func (r RW) String() string {
	switch r {
	case RWRead:
		return "read"
	case RWWrite:
		return "write"
	case RWRandRead:
		return "randread"
	case RWRandWrite:
		return "randwrite"
	case RWRandRW:
		return "randrw"
	case RWReadWrite:
		return "rw"
	}
	return "invalid"
}

// Random reports whether offsets are drawn at random.
func (r RW) Random() bool { return r == RWRandRead || r == RWRandWrite || r == RWRandRW }

// Reads reports whether the pattern issues reads.
func (r RW) Reads() bool { return r != RWWrite && r != RWRandWrite }

// Writes reports whether the pattern issues writes.
func (r RW) Writes() bool { return r != RWRead && r != RWRandRead }

// Limits on job options. Values outside them are ErrBadValue.
const (
	MaxBlockSize = 64 << 20
	MaxIODepth   = 4096
	MaxBatch     = MaxIODepth
	MaxNumJobs   = 256
	MaxSize      = 1 << 40
	MaxRuntime   = 24 * time.Hour
	MaxRampTime  = time.Hour
	MaxJobs      = 1024
	maxLineLen   = 4096
	maxNameLen   = 128
	maxFileBytes = 1 << 20
)

// DefaultSocket is the daemon socket used when neither the daemon option nor
// TENSORCAST_SOCKET says otherwise.
const DefaultSocket = "/run/tensorcast/tensorcastd.sock"

// Engines tcbench knows. Whether one can run is decided when the job starts
// (see ErrEngineUnavailable).
var knownEngines = []string{"local", "uring", "tcp", "rdma", "store", "mem"}

// Source says where a job was defined, for error messages.
type Source struct {
	File string
	Line int
}

func (s Source) String() string { return fmt.Sprintf("%s:%d", s.File, s.Line) }

// Job is one job after its section and the globals before it were merged.
type Job struct {
	Name        string
	Description string
	Engine      string
	RW          RW
	RWMixRead   int // percent of reads for randrw and rw
	BSMin       uint64
	BSMax       uint64
	Size        uint64
	// IOSize is how many bytes a job that is not time based moves in
	// all (fio's io_size), over and over its region of Size bytes; 0 is
	// Size (one pass).
	IOSize    uint64
	IODepth   int
	Batch     int
	NumJobs   int
	Runtime   time.Duration
	TimeBased bool
	RampTime  time.Duration
	Target    string
	Filename  string
	Direct    bool
	Durable   bool   // store: a write answers once its value is on L2
	Verify    string // "" or "crc32c"
	RandSeed  uint64
	Daemon    string
	Stonewall bool
	Goal      string // free text shown in the benchmark table (e.g. ">= 0.8x memcpy")
	// Metric is what --baseline compares: "iops", "bw_bytes", or "lat_p50"
	// (the median latency, lower is better); "" is IOPS below 64 KiB
	// blocks and bandwidth from there.
	Metric string
	// PeerMem is where tcp and rdma jobs keep their bytes: "pool" (pool
	// blocks on both daemons, which RDMA can carry) or "buffer" (client
	// buffers); "" is pool for rdma, buffer for tcp.
	PeerMem string

	// Group is the reporting group: jobs of one group run concurrently, groups
	// run one after the other (a stonewall starts a new group).
	Group int
	Src   Source
}

// defaultJob is what a job is before any option is applied.
func defaultJob() Job {
	daemon := DefaultSocket
	if s := os.Getenv("TENSORCAST_SOCKET"); s != "" {
		daemon = s
	}
	return Job{
		Engine:    "local",
		RW:        RWRead,
		RWMixRead: 50,
		BSMin:     4 << 10,
		BSMax:     4 << 10,
		Size:      64 << 20,
		IODepth:   1,
		Batch:     1,
		NumJobs:   1,
		RandSeed:  0x7c5e_d00d,
		Daemon:    daemon,
	}
}

// ParseError says which file, line and option a parse or validation error
// is about. It wraps one of the package's sentinels.
type ParseError struct {
	File   string
	Line   int
	Option string
	Err    error
}

func (e *ParseError) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Option != "" {
		return fmt.Sprintf("%s: option %q: %v", loc, e.Option, e.Err)
	}
	return fmt.Sprintf("%s: %v", loc, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }

type option struct {
	// flag options may be given without a value ("time_based").
	flag bool
	set  func(j *Job, v string) error
}

var options map[string]option

func init() {
	options = map[string]option{
		"name":        {set: func(j *Job, v string) error { return setName(j, v) }},
		"description": {set: func(j *Job, v string) error { j.Description = v; return nil }},
		"engine":      {set: setEngine},
		"ioengine":    {set: setEngine},
		"rw":          {set: setRW},
		"readwrite":   {set: setRW},
		"rwmixread": {set: func(j *Job, v string) error {
			n, err := parseInt(v, 0, 100)
			j.RWMixRead = n
			return err
		}},
		"rwmixwrite": {set: func(j *Job, v string) error {
			n, err := parseInt(v, 0, 100)
			j.RWMixRead = 100 - n
			return err
		}},
		"bs": {set: func(j *Job, v string) error {
			n, err := parseSizeLimit(v, 1, MaxBlockSize)
			j.BSMin, j.BSMax = n, n
			return err
		}},
		"blocksize": {set: func(j *Job, v string) error { return options["bs"].set(j, v) }},
		"bsrange":   {set: setBSRange},
		"size": {set: func(j *Job, v string) error {
			n, err := parseSizeLimit(v, 1, MaxSize)
			j.Size = n
			return err
		}},
		"io_size": {set: func(j *Job, v string) error {
			n, err := parseSizeLimit(v, 1, 1<<50)
			j.IOSize = n
			return err
		}},
		"iodepth": {set: func(j *Job, v string) error {
			n, err := parseInt(v, 1, MaxIODepth)
			j.IODepth = n
			return err
		}},
		"batch": {set: func(j *Job, v string) error {
			n, err := parseInt(v, 1, MaxBatch)
			j.Batch = n
			return err
		}},
		"numjobs": {set: func(j *Job, v string) error {
			n, err := parseInt(v, 1, MaxNumJobs)
			j.NumJobs = n
			return err
		}},
		"runtime": {set: func(j *Job, v string) error {
			d, err := parseDuration(v, MaxRuntime)
			j.Runtime = d
			return err
		}},
		"ramp_time": {set: func(j *Job, v string) error {
			d, err := parseDuration(v, MaxRampTime)
			j.RampTime = d
			return err
		}},
		"time_based": {flag: true, set: func(j *Job, v string) error {
			b, err := parseBool(v)
			j.TimeBased = b
			return err
		}},
		"direct": {flag: true, set: func(j *Job, v string) error {
			b, err := parseBool(v)
			j.Direct = b
			return err
		}},
		"durable": {flag: true, set: func(j *Job, v string) error {
			b, err := parseBool(v)
			j.Durable = b
			return err
		}},
		"stonewall": {flag: true, set: func(j *Job, v string) error {
			b, err := parseBool(v)
			j.Stonewall = b
			return err
		}},
		"target":   {set: func(j *Job, v string) error { return setPath(&j.Target, v) }},
		"filename": {set: func(j *Job, v string) error { return setPath(&j.Filename, v) }},
		"daemon":   {set: func(j *Job, v string) error { return setPath(&j.Daemon, v) }},
		"verify": {set: func(j *Job, v string) error {
			switch v {
			case "crc32c", "crc32c-intel":
				j.Verify = "crc32c"
			case "0", "none", "":
				j.Verify = ""
			default:
				return fmt.Errorf("%w: %q (supported: crc32c, none)", ErrBadValue, v)
			}
			return nil
		}},
		"randseed": {set: func(j *Job, v string) error {
			n, err := strconv.ParseUint(v, 0, 64)
			if err != nil {
				return fmt.Errorf("%w: %q is not an unsigned integer", ErrBadValue, v)
			}
			j.RandSeed = n
			return nil
		}},
		"peer_mem": {set: func(j *Job, v string) error {
			if v != "pool" && v != "buffer" {
				return fmt.Errorf("%w: %q (pool, buffer)", ErrBadValue, v)
			}
			j.PeerMem = v
			return nil
		}},
		"goal": {set: func(j *Job, v string) error { j.Goal = v; return nil }},
		"metric": {set: func(j *Job, v string) error {
			switch v {
			case "iops", "bw", "bw_bytes", "lat_p50":
			default:
				return fmt.Errorf("%w: %q (iops, bw, lat_p50)", ErrBadValue, v)
			}
			if v == "bw" {
				v = "bw_bytes"
			}
			j.Metric = v
			return nil
		}},
	}
}

func setName(j *Job, v string) error {
	if v == "" || len(v) > maxNameLen {
		return fmt.Errorf("%w: job name must be 1 to %d characters", ErrBadValue, maxNameLen)
	}
	for _, c := range v {
		if c < 0x20 || c == 0x7f || c == '[' || c == ']' || c == '=' {
			return fmt.Errorf("%w: job name %q has a forbidden character", ErrBadValue, v)
		}
	}
	j.Name = v
	return nil
}

func setEngine(j *Job, v string) error {
	for _, e := range knownEngines {
		if v == e {
			j.Engine = v
			return nil
		}
	}
	return fmt.Errorf("%w: unknown engine %q (known: %s)", ErrBadValue, v, strings.Join(knownEngines, ", "))
}

func setRW(j *Job, v string) error {
	switch v {
	case "read":
		j.RW = RWRead
	case "write":
		j.RW = RWWrite
	case "randread":
		j.RW = RWRandRead
	case "randwrite":
		j.RW = RWRandWrite
	case "randrw":
		j.RW = RWRandRW
	case "rw", "readwrite":
		j.RW = RWReadWrite
	default:
		return fmt.Errorf("%w: %q (read, write, randread, randwrite, randrw, rw)", ErrBadValue, v)
	}
	return nil
}

func setBSRange(j *Job, v string) error {
	lo, hi, ok := strings.Cut(v, "-")
	if !ok {
		lo, hi, ok = strings.Cut(v, ":")
	}
	if !ok {
		return fmt.Errorf("%w: %q is not a range MIN-MAX", ErrBadValue, v)
	}
	a, err := parseSizeLimit(lo, 1, MaxBlockSize)
	if err != nil {
		return err
	}
	b, err := parseSizeLimit(hi, 1, MaxBlockSize)
	if err != nil {
		return err
	}
	if a > b {
		return fmt.Errorf("%w: range %q has MIN > MAX", ErrBadValue, v)
	}
	j.BSMin, j.BSMax = a, b
	return nil
}

func setPath(dst *string, v string) error {
	if v == "" || len(v) > maxLineLen || strings.IndexByte(v, 0) >= 0 {
		return fmt.Errorf("%w: empty or malformed path %q", ErrBadValue, v)
	}
	*dst = v
	return nil
}

func parseInt(v string, lo, hi int) (int, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not an integer", ErrBadValue, v)
	}
	if n < int64(lo) || n > int64(hi) {
		return 0, fmt.Errorf("%w: %d is outside [%d, %d]", ErrBadValue, n, lo, hi)
	}
	return int(n), nil
}

func parseBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "", "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("%w: %q is not a boolean", ErrBadValue, v)
}

// ParseSize parses a size with fio's binary suffixes: k=1024, m, g, t, p
// (an optional "i" and "b" are accepted: 4KiB, 4kb, 4k are the same).
func ParseSize(v string) (uint64, error) {
	s := strings.TrimSpace(v)
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("%w: %q is not a size", ErrBadValue, v)
	}
	n, err := strconv.ParseUint(s[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not a size", ErrBadValue, v)
	}
	suf := strings.ToLower(s[i:])
	suf = strings.TrimSuffix(suf, "b")
	suf = strings.TrimSuffix(suf, "i")
	var shift uint
	switch suf {
	case "":
	case "k":
		shift = 10
	case "m":
		shift = 20
	case "g":
		shift = 30
	case "t":
		shift = 40
	case "p":
		shift = 50
	default:
		return 0, fmt.Errorf("%w: %q has an unknown size suffix (k, m, g, t, p)", ErrBadValue, v)
	}
	if shift > 0 && n > (^uint64(0))>>shift {
		return 0, fmt.Errorf("%w: %q overflows", ErrBadValue, v)
	}
	return n << shift, nil
}

func parseSizeLimit(v string, lo, hi uint64) (uint64, error) {
	n, err := ParseSize(v)
	if err != nil {
		return 0, err
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("%w: %s is outside [%d, %d]", ErrBadValue, v, lo, hi)
	}
	return n, nil
}

// parseDuration parses fio times: a bare number is seconds; units us, ms, s,
// m, h, d.
func parseDuration(v string, max time.Duration) (time.Duration, error) {
	s := strings.TrimSpace(v)
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 || i > 12 {
		return 0, fmt.Errorf("%w: %q is not a duration", ErrBadValue, v)
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not a duration", ErrBadValue, v)
	}
	var unit time.Duration
	switch strings.ToLower(s[i:]) {
	case "us", "usec":
		unit = time.Microsecond
	case "ms", "msec":
		unit = time.Millisecond
	case "", "s", "sec":
		unit = time.Second
	case "m", "min":
		unit = time.Minute
	case "h":
		unit = time.Hour
	case "d":
		unit = 24 * time.Hour
	default:
		return 0, fmt.Errorf("%w: %q has an unknown time unit (us, ms, s, m, h, d)", ErrBadValue, v)
	}
	if n > int64(max/unit) {
		return 0, fmt.Errorf("%w: %s is more than the limit %s", ErrBadValue, v, max)
	}
	return time.Duration(n) * unit, nil
}

// builder accumulates jobs from one or more sources; the same code path
// serves job files and command lines so both give the same jobs.
type builder struct {
	global Job
	jobs   []*Job
	cur    *Job // job being filled, nil while in [global]
	names  map[string]Source
	group  int
}

func newBuilder(global Job) *builder {
	return &builder{global: global, names: map[string]Source{}}
}

func (b *builder) set(src Source, key, val string, hasVal bool) error {
	key = strings.ToLower(strings.TrimSpace(key))
	opt, ok := options[key]
	if !ok || key == "name" {
		return &ParseError{File: src.File, Line: src.Line, Option: key, Err: fmt.Errorf("%w", ErrUnknownOption)}
	}
	if !hasVal && !opt.flag {
		return &ParseError{File: src.File, Line: src.Line, Option: key, Err: fmt.Errorf("%w: option needs a value", ErrBadValue)}
	}
	dst := &b.global
	if b.cur != nil {
		dst = b.cur
	}
	if err := opt.set(dst, strings.TrimSpace(val)); err != nil {
		return &ParseError{File: src.File, Line: src.Line, Option: key, Err: err}
	}
	return nil
}

// startJob closes the current job and opens a new one named name.
func (b *builder) startJob(src Source, name string) error {
	if err := b.finish(); err != nil {
		return err
	}
	if len(b.jobs) >= MaxJobs {
		return &ParseError{File: src.File, Line: src.Line, Err: fmt.Errorf("%w: more than %d jobs", ErrBadValue, MaxJobs)}
	}
	j := b.global
	if err := setName(&j, name); err != nil {
		return &ParseError{File: src.File, Line: src.Line, Option: "name", Err: err}
	}
	if prev, dup := b.names[name]; dup {
		return &ParseError{File: src.File, Line: src.Line, Err: fmt.Errorf("%w: %q (first defined at %s)", ErrDuplicateJob, name, prev)}
	}
	b.names[name] = src
	j.Src = src
	b.cur = &j
	return nil
}

// enterGlobal closes the current job; following options are global.
func (b *builder) enterGlobal() error {
	err := b.finish()
	b.cur = nil
	return err
}

func (b *builder) finish() error {
	if b.cur == nil {
		return nil
	}
	j := b.cur
	b.cur = nil
	if err := validate(j); err != nil {
		return err
	}
	if j.Stonewall && len(b.jobs) > 0 {
		b.group++
	}
	j.Group = b.group
	b.jobs = append(b.jobs, j)
	return nil
}

// validate checks what single options cannot: combinations and what each
// engine needs.
func validate(j *Job) error {
	bad := func(opt string, err error) error {
		return &ParseError{File: j.Src.File, Line: j.Src.Line, Option: opt, Err: err}
	}
	if j.Size < j.BSMax {
		return bad("size", fmt.Errorf("%w: size %d is smaller than the block size %d", ErrBadValue, j.Size, j.BSMax))
	}
	if j.Batch > j.IODepth {
		return bad("batch", fmt.Errorf("%w: batch %d is more than iodepth %d", ErrBadValue, j.Batch, j.IODepth))
	}
	if uint64(j.IODepth)*j.BSMax > 4<<30 {
		return bad("iodepth", fmt.Errorf("%w: iodepth × bs is more than 4 GiB of buffers", ErrBadValue))
	}
	if j.TimeBased && j.Runtime == 0 {
		return bad("time_based", fmt.Errorf("%w: time_based needs a runtime", ErrMissingOption))
	}
	switch j.Engine {
	case "uring":
		if j.Filename == "" {
			return bad("filename", fmt.Errorf("%w: engine uring needs a filename", ErrMissingOption))
		}
		if j.Direct && (j.BSMin%512 != 0 || j.BSMax%512 != 0) {
			return bad("bs", fmt.Errorf("%w: direct I/O needs block sizes that are multiples of 512", ErrBadValue))
		}
	case "store":
		if j.BSMin != j.BSMax {
			return bad("bs", fmt.Errorf("%w: engine store needs one bs (a key is one block of the region)", ErrBadValue))
		}
		if j.Size%j.BSMax != 0 {
			return bad("size", fmt.Errorf("%w: engine store needs a size that is a multiple of bs", ErrBadValue))
		}
	case "tcp", "rdma":
		// A missing target is checked by CheckTargets: --spawn supplies one.
		if j.Target == "" {
			break
		}
		if p, s, ok := strings.Cut(j.Target, "/"); !ok || p == "" || s == "" || strings.Contains(s, "/") {
			return bad("target", fmt.Errorf("%w: target %q is not peer/segment", ErrBadValue, j.Target))
		}
	}
	return nil
}

func (b *builder) done() ([]*Job, error) {
	if err := b.finish(); err != nil {
		return nil, err
	}
	return b.jobs, nil
}

// parseInto reads one INI job file into b.
func parseInto(b *builder, file string, r io.Reader) error {
	sc := bufio.NewScanner(io.LimitReader(r, maxFileBytes+1))
	sc.Buffer(make([]byte, 0, 512), maxLineLen+2)
	line, total := 0, 0
	for sc.Scan() {
		line++
		total += len(sc.Bytes()) + 1
		if total > maxFileBytes {
			return &ParseError{File: file, Line: line, Err: fmt.Errorf("%w: job file larger than %d bytes", ErrSyntax, maxFileBytes)}
		}
		src := Source{File: file, Line: line}
		s := strings.TrimSpace(strings.TrimSuffix(sc.Text(), "\r"))
		if s == "" || s[0] == ';' || s[0] == '#' {
			continue
		}
		if s[0] == '[' {
			if s[len(s)-1] != ']' || len(s) < 3 {
				return &ParseError{File: file, Line: line, Err: fmt.Errorf("%w: malformed section header %q", ErrSyntax, s)}
			}
			name := strings.TrimSpace(s[1 : len(s)-1])
			var err error
			if name == "global" {
				err = b.enterGlobal()
			} else {
				err = b.startJob(src, name)
			}
			if err != nil {
				return err
			}
			continue
		}
		key, val, hasVal := strings.Cut(s, "=")
		if !hasVal {
			// A trailing comment on a bare flag: "time_based ; comment".
			key = stripComment(key)
		} else {
			val = stripComment(val)
		}
		if strings.TrimSpace(key) == "" {
			return &ParseError{File: file, Line: line, Err: fmt.Errorf("%w: option without a name", ErrSyntax)}
		}
		if err := b.set(src, key, val, hasVal); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return &ParseError{File: file, Line: line + 1, Err: fmt.Errorf("%w: %v", ErrSyntax, err)}
	}
	return nil
}

// stripComment drops a trailing " ;..." or " #..." comment.
func stripComment(s string) string {
	for i := 1; i < len(s); i++ {
		if (s[i] == ';' || s[i] == '#') && (s[i-1] == ' ' || s[i-1] == '\t') {
			return strings.TrimSpace(s[:i])
		}
	}
	return strings.TrimSpace(s)
}

// ParseJobFile parses an INI job file: a [global] section and one section
// per job, ';' and '#' comments. file names the source in errors.
func ParseJobFile(file string, r io.Reader) ([]*Job, error) {
	b := newBuilder(defaultJob())
	if err := parseInto(b, file, r); err != nil {
		return nil, err
	}
	jobs, err := b.done()
	if err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return nil, &ParseError{File: file, Err: ErrNoJobs}
	}
	return jobs, nil
}

// CheckTargets reports the first tcp or rdma job without a target: without
// --spawn (which exports one) such a job has nothing to address.
func CheckTargets(jobs []*Job) error {
	for _, j := range jobs {
		if isPeerEngine(j.Engine) && j.Target == "" {
			return &ParseError{File: j.Src.File, Line: j.Src.Line, Option: "target",
				Err: fmt.Errorf("%w: engine %s needs a target (peer/segment exported on the peer; --spawn makes one)", ErrMissingOption, j.Engine)}
		}
	}
	return nil
}

// PoolMem reports whether a tcp or rdma job keeps its bytes in pool blocks.
func (j *Job) PoolMem() bool {
	if j.PeerMem != "" {
		return j.PeerMem == "pool"
	}
	return j.Engine == "rdma"
}
