package bench

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func TestMain(m *testing.M) {
	testutil.Main(m,
		testutil.Child(pingPongEnv, func(string) int { ServePingPong(); return 0 }), // the far side of TestPingPong
		testutil.Child("TCBENCH_FAKE_DAEMON", func(mode string) int { return fakeDaemon(mode, os.Args[1:]) }),
		testutil.After(func() {
			if daemonBin != "" {
				os.RemoveAll(filepath.Dir(daemonBin))
			}
		}))
}

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		err  bool
	}{
		{"4096", 4096, false}, {"4k", 4096, false}, {"4K", 4096, false}, {"4KiB", 4096, false},
		{"4kb", 4096, false}, {"1m", 1 << 20, false}, {"2g", 2 << 30, false}, {"1t", 1 << 40, false},
		{"4x", 0, true}, {"k", 0, true}, {"", 0, true}, {"-4k", 0, true}, {"4kk", 0, true},
		{"99999999999999999999", 0, true}, {"20000000p", 0, true},
	} {
		got, err := ParseSize(c.in)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, err=%v", c.in, got, err, c.want, c.err)
		}
		if err != nil && !errors.Is(err, ErrBadValue) {
			t.Errorf("ParseSize(%q) error %v is not ErrBadValue", c.in, err)
		}
	}
}

func parseString(t *testing.T, s string) ([]*Job, error) {
	t.Helper()
	return ParseJobFile("jobs.fio", strings.NewReader(s))
}

func TestParseJobFile(t *testing.T) {
	jobs, err := parseString(t, `
; a comment
# another
[global]
engine=mem
bs=64k
size = 128m
runtime=2s
time_based

[seq]
rw=read ; trailing comment
iodepth=8
batch=4

[mix]
rw=randrw
rwmixread=70
bsrange=4k-1m
numjobs=2
verify=crc32c
randseed=42
stonewall
`)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 {
		t.Fatalf("got %d jobs, want 2", len(jobs))
	}
	s, m := jobs[0], jobs[1]
	if s.Name != "seq" || s.Engine != "mem" || s.RW != RWRead || s.BSMin != 64<<10 || s.Size != 128<<20 ||
		s.IODepth != 8 || s.Batch != 4 || s.Runtime != 2*time.Second || !s.TimeBased || s.Group != 0 || s.Src.Line != 11 {
		t.Errorf("seq job wrong: %+v", *s)
	}
	if m.RW != RWRandRW || m.RWMixRead != 70 || m.BSMin != 4<<10 || m.BSMax != 1<<20 || m.NumJobs != 2 ||
		m.Verify != "crc32c" || m.RandSeed != 42 || m.Group != 1 || m.BSMin == 64<<10 {
		t.Errorf("mix job wrong: %+v", *m)
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		err  error
		line int
		opt  string
	}{
		{"unknown option", "[a]\nbogus=1\n", ErrUnknownOption, 2, "bogus"},
		{"bad size suffix", "[a]\nbs=4x\n", ErrBadValue, 2, "bs"},
		{"bad size", "[a]\nsize=lots\n", ErrBadValue, 2, "size"},
		{"bad rw", "[a]\nrw=sideways\n", ErrBadValue, 2, "rw"},
		{"rwmixread over", "[a]\nrw=randrw\nrwmixread=101\n", ErrBadValue, 3, "rwmixread"},
		{"rwmixread under", "[a]\nrwmixread=-1\n", ErrBadValue, 2, "rwmixread"},
		{"duplicate job", "[a]\n[b]\n[a]\n", ErrDuplicateJob, 3, ""},
		{"missing filename for uring", "[a]\nengine=uring\nbs=4k\n", ErrMissingOption, 1, "filename"},
		{"bad target", "[a]\nengine=rdma\ntarget=nopeer\n", ErrBadValue, 1, "target"},
		{"unknown engine", "[a]\nengine=warp\n", ErrBadValue, 2, "engine"},
		{"bs over limit", "[a]\nbs=1g\n", ErrBadValue, 2, "bs"},
		{"bs zero", "[a]\nbs=0\n", ErrBadValue, 2, "bs"},
		{"iodepth zero", "[a]\niodepth=0\n", ErrBadValue, 2, "iodepth"},
		{"iodepth over", "[a]\niodepth=100000\n", ErrBadValue, 2, "iodepth"},
		{"numjobs over", "[a]\nnumjobs=1000\n", ErrBadValue, 2, "numjobs"},
		{"size over", "[a]\nsize=2t\n", ErrBadValue, 2, "size"},
		{"size under bs", "[a]\nbs=1m\nsize=4k\n", ErrBadValue, 1, "size"},
		{"runtime over", "[a]\nruntime=2d\n", ErrBadValue, 2, "runtime"},
		{"runtime unit", "[a]\nruntime=5y\n", ErrBadValue, 2, "runtime"},
		{"ramp over", "[a]\nramp_time=2h\n", ErrBadValue, 2, "ramp_time"},
		{"batch over iodepth", "[a]\niodepth=4\nbatch=8\n", ErrBadValue, 1, "batch"},
		{"bsrange reversed", "[a]\nbsrange=64k-4k\n", ErrBadValue, 2, "bsrange"},
		{"bsrange malformed", "[a]\nbsrange=64k\n", ErrBadValue, 2, "bsrange"},
		{"verify kind", "[a]\nverify=md5\n", ErrBadValue, 2, "verify"},
		{"bool value", "[a]\ntime_based=maybe\n", ErrBadValue, 2, "time_based"},
		{"value missing", "[a]\nbs\n", ErrBadValue, 2, "bs"},
		{"time_based no runtime", "[a]\ntime_based\n", ErrMissingOption, 1, "time_based"},
		{"direct misaligned", "[a]\nengine=uring\nfilename=/x\ndirect=1\nbs=1000\n", ErrBadValue, 1, "bs"},
		{"bad section", "[a\n", ErrSyntax, 1, ""},
		{"empty section", "[]\n", ErrSyntax, 1, ""},
		{"no key", "=4\n", ErrSyntax, 1, ""},
		{"no jobs", "[global]\nbs=4k\n", ErrNoJobs, 0, ""},
		{"bad randseed", "[a]\nrandseed=x\n", ErrBadValue, 2, "randseed"},
		{"bad name", "[a=b]\n", ErrBadValue, 1, "name"},
		{"error in global", "[global]\nbs=7q\n[a]\n", ErrBadValue, 2, "bs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseString(t, c.in)
			if !errors.Is(err, c.err) {
				t.Fatalf("err = %v, want %v", err, c.err)
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err %v is not a *ParseError", err)
			}
			if pe.File != "jobs.fio" || pe.Line != c.line || pe.Option != c.opt {
				t.Fatalf("err at %s:%d option %q, want jobs.fio:%d option %q", pe.File, pe.Line, pe.Option, c.line, c.opt)
			}
			msg := err.Error()
			if c.line > 0 && !strings.Contains(msg, "jobs.fio:"+strconv.Itoa(c.line)) {
				t.Errorf("message %q does not name the file and line", msg)
			}
			if c.opt != "" && !strings.Contains(msg, `"`+c.opt+`"`) {
				t.Errorf("message %q does not name the option", msg)
			}
		})
	}
}

func TestCLIAndINIGiveSameJobs(t *testing.T) {
	ini := `[global]
engine=mem
size=32m
runtime=3s
time_based
[r1]
rw=randread
bs=4k
iodepth=32
batch=8
[w1]
rw=write
bs=1m
numjobs=2
verify=crc32c
stonewall
`
	fromINI, err := parseString(t, ini)
	if err != nil {
		t.Fatal(err)
	}
	_, fromCLI, err := ParseArgs([]string{"--engine=mem", "--size=32m", "--runtime=3s", "--time_based",
		"--name=r1", "--rw=randread", "--bs=4k", "--iodepth=32", "--batch=8",
		"--name=w1", "--rw=write", "--bs=1m", "--numjobs=2", "--verify=crc32c", "--stonewall"})
	if err != nil {
		t.Fatal(err)
	}
	if len(fromINI) != len(fromCLI) {
		t.Fatalf("INI gave %d jobs, CLI %d", len(fromINI), len(fromCLI))
	}
	for i := range fromINI {
		a, b := *fromINI[i], *fromCLI[i]
		a.Src, b.Src = Source{}, Source{}
		if !reflect.DeepEqual(a, b) {
			t.Errorf("job %d differs:\n INI %+v\n CLI %+v", i, a, b)
		}
	}
}

func TestParseArgs(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "j.fio")
	if err := os.WriteFile(f, []byte("[filejob]\nrw=write\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, jobs, err := ParseArgs([]string{"--output-format=json", "--spawn", "--repeat", "3", "--plot=x.svg", "--bs=8k",
		"--name=a", f})
	if err != nil {
		t.Fatal(err)
	}
	if o.OutputFormat != FormatJSON || !o.Spawn || o.Repeat != 3 || o.Plot != "x.svg" {
		t.Errorf("options wrong: %+v", o)
	}
	if len(jobs) != 2 || jobs[0].Name != "a" || jobs[1].Name != "filejob" || jobs[1].BSMin != 8<<10 || jobs[1].Group != 1 {
		t.Fatalf("jobs wrong: %+v %+v", jobs[0], jobs[1])
	}

	for _, c := range []struct {
		args []string
		err  error
		arg  int
	}{
		{[]string{"--name=a", "--bogus=1"}, ErrUnknownOption, 2},
		{[]string{"--name=a", "--bs=12z"}, ErrBadValue, 2},
		{[]string{"--name=a", "--name=a"}, ErrDuplicateJob, 2},
		{[]string{"--output-format=xml", "--name=a"}, ErrBadValue, 1},
		{[]string{"--name=a", "--engine=uring"}, ErrMissingOption, 1},
		{[]string{"--repeat"}, ErrBadValue, 1},
		{[]string{}, ErrNoJobs, 0},
	} {
		_, _, err := ParseArgs(c.args)
		if !errors.Is(err, c.err) {
			t.Errorf("ParseArgs(%q) = %v, want %v", c.args, err, c.err)
			continue
		}
		var pe *ParseError
		if errors.As(err, &pe) && (pe.File != cliFile || pe.Line != c.arg) {
			t.Errorf("ParseArgs(%q): error at %s:%d, want argument %d", c.args, pe.File, pe.Line, c.arg)
		}
	}
	if _, _, err := ParseArgs([]string{filepath.Join(dir, "missing.fio")}); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing job file: %v", err)
	}
}

func TestDaemonDefault(t *testing.T) {
	t.Setenv("TENSORCAST_SOCKET", "/tmp/x.sock")
	jobs, err := parseString(t, "[a]\n")
	if err != nil {
		t.Fatal(err)
	}
	if jobs[0].Daemon != "/tmp/x.sock" {
		t.Errorf("daemon = %q, want TENSORCAST_SOCKET", jobs[0].Daemon)
	}
	t.Setenv("TENSORCAST_SOCKET", "")
	jobs, _ = parseString(t, "[a]\n")
	if jobs[0].Daemon != DefaultSocket {
		t.Errorf("daemon = %q, want %q", jobs[0].Daemon, DefaultSocket)
	}
}

func FuzzParseJobFile(f *testing.F) {
	f.Add([]byte("[global]\nbs=4k\n[a]\nrw=randread\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		jobs, err := ParseJobFile("fuzz.fio", strings.NewReader(string(b)))
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *ParseError", err)
			}
			return
		}
		for _, j := range jobs {
			if j.BSMin == 0 || j.BSMin > j.BSMax || j.BSMax > MaxBlockSize || j.Size < j.BSMax || j.Size > MaxSize ||
				j.IODepth < 1 || j.IODepth > MaxIODepth || j.Batch > j.IODepth || j.NumJobs < 1 || j.NumJobs > MaxNumJobs ||
				j.Runtime > MaxRuntime || j.RWMixRead < 0 || j.RWMixRead > 100 {
				t.Fatalf("accepted a job outside the limits: %+v", *j)
			}
		}
	})
}

func TestExampleJobFilesParse(t *testing.T) {
	files, err := filepath.Glob("../examples/jobs/*.fio")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example job files: %v", err)
	}
	for _, f := range files {
		_, jobs, err := ParseArgs([]string{f})
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		for _, j := range jobs {
			if j.Goal == "" || j.Runtime == 0 || !j.TimeBased {
				t.Errorf("%s: job %s lacks a goal or a time-based runtime", f, j.Name)
			}
		}
	}
}
