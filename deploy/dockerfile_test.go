package deploy

import (
	"bufio"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/tensorcast/tensorcast/daemon"
)

// instruction is one Dockerfile instruction: its keyword (upper case) and
// its arguments, continuation lines joined.
type instruction struct {
	cmd, args string
	line      int
}

// stage is a FROM and the instructions under it.
type stage struct {
	from, name string
	ins        []instruction
}

// parseDockerfile reads the instructions of path by stage; ARGs before the
// first FROM are returned apart with their defaults.
func parseDockerfile(t *testing.T, path string) (args map[string]string, stages []*stage) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args = map[string]string{}
	sc := bufio.NewScanner(f)
	var cur string
	start, n := 0, 0
	flush := func() {
		s := strings.TrimSpace(cur)
		cur = ""
		if s == "" {
			return
		}
		kw, rest, _ := strings.Cut(s, " ")
		in := instruction{strings.ToUpper(kw), strings.TrimSpace(rest), start}
		switch {
		case in.cmd == "FROM":
			from, name, _ := strings.Cut(in.args, " AS ")
			stages = append(stages, &stage{from: strings.TrimSpace(from), name: strings.TrimSpace(name)})
		case len(stages) == 0 && in.cmd == "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			args[k] = v
		case len(stages) == 0:
			t.Fatalf("%s:%d: %s before the first FROM", path, in.line, in.cmd)
		default:
			stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
		}
	}
	for sc.Scan() {
		n++
		line := sc.Text()
		if trimmed := strings.TrimSpace(line); cur == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur == "" {
			start = n
		}
		if body, ok := strings.CutSuffix(line, "\\"); ok {
			cur += body + " "
			continue
		}
		cur += line
		flush()
	}
	flush()
	if len(stages) == 0 {
		t.Fatalf("%s: no FROM", path)
	}
	return args, stages
}

// runs are the stage's RUN commands, split at &&.
func (s *stage) runs() []string {
	var out []string
	for _, in := range s.ins {
		if in.cmd == "RUN" {
			for _, c := range strings.Split(in.args, "&&") {
				out = append(out, strings.Join(strings.Fields(c), " "))
			}
		}
	}
	return out
}

// aptPackages are what the stage's apt-get install commands install.
func (s *stage) aptPackages() []string {
	var out []string
	for _, c := range s.runs() {
		if rest, ok := strings.CutPrefix(c, "apt-get install "); ok {
			for _, f := range strings.Fields(rest) {
				if !strings.HasPrefix(f, "-") {
					out = append(out, f)
				}
			}
		}
	}
	return out
}

// depsGroup is the Debian packages of one group of scripts/deps.sh.
func depsGroup(t *testing.T, group string) []string {
	t.Helper()
	b, err := os.ReadFile("../scripts/deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*\[` + group + `\]="([^"]*)"`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("scripts/deps.sh has no %s group", group)
	}
	return strings.Fields(string(m[1]))
}

// TestDockerfile checks deploy/Dockerfile against what it must agree with,
// statically: the Go release against go.mod, its go build against the
// Makefile's (same flags, the binaries the chart runs), its packages
// against scripts/deps.sh's build and rdma groups, a runtime stage with no
// toolchain, the binaries on PATH with tensorcastd the entry point (the
// chart passes only args and runs tcctl by name), and the chart's image
// defaults naming what the build command in the Dockerfile tags.
func TestDockerfile(t *testing.T) {
	const path = "Dockerfile"
	args, stages := parseDockerfile(t, path)
	if len(stages) != 2 || stages[0].name != "build" {
		t.Fatalf("%s: %d stages (first %q); want a build stage and a runtime stage", path, len(stages), stages[0].name)
	}
	build, runtime := stages[0], stages[1]

	// The Go release: go.mod's go line or a later patch of its minor
	// release, and its toolchain line when there is one.
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)(?:\.(\d+))?$`).FindSubmatch(gomod)
	if goLine == nil {
		t.Fatal("go.mod has no go line")
	}
	v := regexp.MustCompile(`^(\d+)\.(\d+)\.(\d+)$`).FindStringSubmatch(args["GO_VERSION"])
	if v == nil {
		t.Fatalf("%s: ARG GO_VERSION=%q is not a pinned release (1.x.y)", path, args["GO_VERSION"])
	}
	if v[1] != string(goLine[1]) || v[2] != string(goLine[2]) || len(goLine[3]) > 0 && atoi(v[3]) < atoi(string(goLine[3])) {
		t.Errorf("GO_VERSION %s does not satisfy go.mod's go %s.%s.%s", args["GO_VERSION"], goLine[1], goLine[2], goLine[3])
	}
	if tc := regexp.MustCompile(`(?m)^toolchain go(\S+)$`).FindSubmatch(gomod); tc != nil && string(tc[1]) != args["GO_VERSION"] {
		t.Errorf("GO_VERSION %s, go.mod's toolchain go%s", args["GO_VERSION"], tc[1])
	}
	if !strings.HasPrefix(build.from, "golang:${GO_VERSION}-") {
		t.Errorf("build stage FROM %s, want golang:${GO_VERSION}-...", build.from)
	}
	if strings.Contains(runtime.from, "golang") {
		t.Errorf("runtime stage FROM %s: the toolchain stays in the build stage", runtime.from)
	}

	// go build as the Makefile's build target: same flags, packages it
	// builds, and the two the image needs.
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	mkBuild := regexp.MustCompile(`(?m)^build:.*\n(?:\t.*\n)*?\t\$\(GO\) build (.*)$`).FindSubmatch(mk)
	if mkBuild == nil {
		t.Fatal("the Makefile's build target has no $(GO) build")
	}
	mkFlags, mkPkgs := goBuildArgs(string(mkBuild[1]))
	var dFlags, dPkgs []string
	for _, c := range build.runs() {
		if rest, ok := strings.CutPrefix(c, "go build "); ok {
			dFlags, dPkgs = goBuildArgs(rest)
		}
		if strings.Contains(c, "CGO_ENABLED=0") {
			t.Errorf("%q: the daemon needs cgo for RDMA (rdma/verbs_linux.go)", c)
		}
	}
	if dPkgs == nil {
		t.Fatalf("%s: the build stage runs no go build", path)
	}
	if !slices.Equal(dFlags, mkFlags) {
		t.Errorf("go build flags %q, the Makefile's %q", dFlags, mkFlags)
	}
	if !slices.Equal(dPkgs, []string{"./cmd/tensorcastd", "./cmd/tcctl"}) {
		t.Errorf("go build of %q, want ./cmd/tensorcastd and ./cmd/tcctl", dPkgs)
	}
	for _, p := range dPkgs {
		covered := false
		for _, m := range mkPkgs {
			covered = covered || p == m || strings.HasSuffix(m, "/...") && strings.HasPrefix(p, strings.TrimSuffix(m, "..."))
		}
		if !covered {
			t.Errorf("the image builds %s, which make build does not (%q)", p, mkPkgs)
		}
	}

	// Packages: the build stage's are make build's; the runtime's are the
	// RDMA libraries, and no compiler.
	buildGroup, rdmaGroup := depsGroup(t, "build"), depsGroup(t, "rdma")
	bp := build.aptPackages()
	for _, p := range bp {
		if !slices.Contains(buildGroup, p) {
			t.Errorf("the build stage installs %s, which scripts/deps.sh's build group does not", p)
		}
	}
	if !slices.Contains(bp, "libibverbs-dev") {
		t.Error("the build stage does not install libibverbs-dev, whose <infiniband/verbs.h> rdma/verbs_linux.h includes")
	}
	rp := runtime.aptPackages()
	for _, p := range rp {
		if !slices.Contains(rdmaGroup, p) || strings.HasSuffix(p, "-dev") {
			t.Errorf("the runtime stage installs %s: only the RDMA run-time libraries of scripts/deps.sh's rdma group belong there", p)
		}
	}
	for _, want := range []string{"libibverbs1", "ibverbs-providers"} {
		if !slices.Contains(rp, want) {
			t.Errorf("the runtime stage lacks %s (RDMA to peers)", want)
		}
	}

	// The binaries on PATH, tensorcastd the entry point.
	var copied, entry string
	for _, in := range runtime.ins {
		switch in.cmd {
		case "COPY":
			copied = in.args
		case "ENTRYPOINT":
			entry = in.args
		}
	}
	if copied != "--from=build /out/tensorcastd /out/tcctl /usr/local/bin/" {
		t.Errorf("runtime COPY %q, want tensorcastd and tcctl from the build stage into /usr/local/bin/", copied)
	}
	if entry != `["/usr/local/bin/tensorcastd"]` {
		t.Errorf("ENTRYPOINT %s, want tensorcastd (the chart passes its args only)", entry)
	}

	// The build context leaves out the git directory (a worktree's .git is
	// a file naming a directory outside the context, and go build's VCS
	// stamping fails on it) and what builds leave behind.
	ignore, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".git", "bin/"} {
		if !slices.Contains(strings.Fields(string(ignore)), want) {
			t.Errorf(".dockerignore does not leave out %s", want)
		}
	}

	// The chart's image: the repository the build command tags, and its
	// appVersion the daemon's version, which is that tag.
	df, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tag := regexp.MustCompile(`docker build -f deploy/Dockerfile -t (\S+):(\S+) \.`).FindSubmatch(df)
	if tag == nil {
		t.Fatalf("%s does not say how to build it (docker build -f deploy/Dockerfile -t REPO:TAG .)", path)
	}
	var values struct {
		Image struct{ Repository, Tag string }
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	readYAML(t, "helm/tensorcast/values.yaml", &values)
	readYAML(t, "helm/tensorcast/Chart.yaml", &chart)
	if values.Image.Repository != string(tag[1]) || values.Image.Tag != "" {
		t.Errorf("the chart's image %s:%q, the Dockerfile tags %s (the chart's tag defaults to its appVersion)", values.Image.Repository, values.Image.Tag, tag[1])
	}
	if chart.AppVersion != daemon.Version || string(tag[2]) != daemon.Version {
		t.Errorf("chart appVersion %s, Dockerfile tag %s, daemon version %s: all three are the image's tag", chart.AppVersion, tag[2], daemon.Version)
	}
}

// goBuildArgs splits a go build command line into its flags (but -o and
// its value) and its packages.
func goBuildArgs(s string) (flags, pkgs []string) {
	f := strings.Fields(s)
	for i := 0; i < len(f); i++ {
		switch {
		case f[i] == "-o":
			i++
		case strings.HasPrefix(f[i], "-"):
			flags = append(flags, f[i])
		default:
			pkgs = append(pkgs, f[i])
		}
	}
	return flags, pkgs
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = 10*n + int(c-'0')
	}
	return n
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
