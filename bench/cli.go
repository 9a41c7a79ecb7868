package bench

import (
	"fmt"
	"os"
	"strings"
)

// Output formats of a run's report.
const (
	FormatNormal = "normal"
	FormatJSON   = "json"
	FormatTerse  = "terse"
)

// Options are tcbench's own flags (everything that is not a job option).
type Options struct {
	OutputFormat string
	Output       string // report file; "" is stdout
	Spawn        bool
	DaemonBin    string
	PoolSize     uint64 // 0: sized from the jobs
	PeerHost     string // --spawn: the address spawned peer daemons listen on ("" = 127.0.0.1)
	RDMADevice   string // --spawn rdma daemons' and the perftest baseline's RDMA device ("" = automatic)
	RDMAGID      string // their RoCE GID, an index or address ("" = automatic)
	Baseline     bool
	Repeat       int
	Plot         string
	Help         bool
	DryRun       bool
	Version      bool
	Files        []string
}

type harnessFlag struct {
	flag bool
	set  func(o *Options, v string) error
}

var harnessFlags = map[string]harnessFlag{
	"output-format": {set: func(o *Options, v string) error {
		switch v {
		case FormatNormal, FormatJSON, FormatTerse:
			o.OutputFormat = v
			return nil
		}
		return fmt.Errorf("%w: %q (normal, json, terse)", ErrBadValue, v)
	}},
	"output":     {set: func(o *Options, v string) error { return setPath(&o.Output, v) }},
	"spawn":      {flag: true, set: func(o *Options, v string) (err error) { o.Spawn, err = parseBool(v); return }},
	"daemon-bin": {set: func(o *Options, v string) error { return setPath(&o.DaemonBin, v) }},
	"pool-size": {set: func(o *Options, v string) (err error) {
		o.PoolSize, err = parseSizeLimit(v, 1<<20, MaxSize)
		return
	}},
	"peer-host": {set: func(o *Options, v string) error {
		if v == "" || strings.ContainsAny(v, " /\t\n") || len(v) > 255 {
			return fmt.Errorf("%w: --peer-host %q is not a host name or address", ErrBadValue, v)
		}
		o.PeerHost = v
		return nil
	}},
	"rdma-device": {set: func(o *Options, v string) error {
		if v == "" || strings.ContainsAny(v, " /\t\n") || len(v) > 64 {
			return fmt.Errorf("%w: --rdma-device %q is not a device name (e.g. mlx5_0, rxe0)", ErrBadValue, v)
		}
		o.RDMADevice = v
		return nil
	}},
	"rdma-gid": {set: func(o *Options, v string) error {
		if v == "" || strings.ContainsAny(v, " /\t\n") || len(v) > 64 {
			return fmt.Errorf("%w: --rdma-gid %q is not a GID index or address", ErrBadValue, v)
		}
		o.RDMAGID = v
		return nil
	}},
	"baseline": {flag: true, set: func(o *Options, v string) (err error) { o.Baseline, err = parseBool(v); return }},
	"repeat": {set: func(o *Options, v string) (err error) {
		o.Repeat, err = parseInt(v, 1, 100)
		return
	}},
	"plot":    {set: func(o *Options, v string) error { return setPath(&o.Plot, v) }},
	"dry-run": {flag: true, set: func(o *Options, v string) (err error) { o.DryRun, err = parseBool(v); return }},
	"help":    {flag: true, set: func(o *Options, v string) (err error) { o.Help, err = parseBool(v); return }},
	"version": {flag: true, set: func(o *Options, v string) (err error) { o.Version, err = parseBool(v); return }},
}

const cliFile = "command line"

// ParseArgs parses a tcbench command line: tcbench's own flags, job options
// in fio's form (--name=x starts a new job; options before the first --name
// are global), and job file paths. Job files are read after the command
// line's jobs, each starting from the command line's globals.
func ParseArgs(args []string) (*Options, []*Job, error) {
	o := &Options{OutputFormat: FormatNormal, Repeat: 1}
	b := newBuilder(defaultJob())
	for i := 0; i < len(args); i++ {
		a := args[i]
		src := Source{File: cliFile, Line: i + 1}
		if !strings.HasPrefix(a, "-") || a == "-" {
			o.Files = append(o.Files, a)
			continue
		}
		kv := strings.TrimLeft(a, "-")
		key, val, hasVal := strings.Cut(kv, "=")
		key = strings.ToLower(key)
		if hf, ok := harnessFlags[key]; ok {
			if !hasVal && !hf.flag {
				if i+1 >= len(args) {
					return nil, nil, &ParseError{File: cliFile, Line: i + 1, Option: key, Err: fmt.Errorf("%w: option needs a value", ErrBadValue)}
				}
				i++
				val, hasVal = args[i], true
			}
			if err := hf.set(o, val); err != nil {
				return nil, nil, &ParseError{File: cliFile, Line: src.Line, Option: key, Err: err}
			}
			continue
		}
		if key == "name" {
			if !hasVal {
				return nil, nil, &ParseError{File: cliFile, Line: src.Line, Option: key, Err: fmt.Errorf("%w: option needs a value", ErrBadValue)}
			}
			if err := b.startJob(src, val); err != nil {
				return nil, nil, err
			}
			continue
		}
		if err := b.set(src, key, val, hasVal); err != nil {
			return nil, nil, err
		}
	}
	if err := b.finish(); err != nil {
		return nil, nil, err
	}
	if o.Help || o.Version {
		return o, b.jobs, nil
	}
	cliGlobal := b.global
	for _, f := range o.Files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, nil, fmt.Errorf("bench: job file: %w", err)
		}
		b.global = cliGlobal
		b.cur = nil
		if b.group > 0 || len(b.jobs) > 0 {
			// Each file starts a new group, like a stonewall.
			b.group++
		}
		before := len(b.jobs)
		err = parseInto(b, f, fh)
		fh.Close()
		if err == nil {
			err = b.finish()
		}
		if err != nil {
			return nil, nil, err
		}
		if len(b.jobs) == before {
			return nil, nil, &ParseError{File: f, Err: ErrNoJobs}
		}
	}
	if len(b.jobs) == 0 {
		return nil, nil, &ParseError{File: cliFile, Err: fmt.Errorf("%w: give --name=... options or a job file", ErrNoJobs)}
	}
	renumberGroups(b.jobs)
	return o, b.jobs, nil
}

// renumberGroups makes group ids dense from 0.
func renumberGroups(jobs []*Job) {
	next, last := -1, -1
	for _, j := range jobs {
		if j.Group != last {
			next++
			last = j.Group
		}
		j.Group = next
	}
}
