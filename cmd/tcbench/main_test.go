package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/bench"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func TestRunJSONAndSummarize(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "r.json")
	plot := filepath.Join(dir, "p.svg")
	var stdout, stderr bytes.Buffer
	code := run([]string{"--baseline", "--repeat=2", "--output-format=json", "--output", out, "--plot=" + plot,
		"--engine=mem", "--name=copy", "--bs=64k", "--size=4m", "--runtime=100ms", "--time_based", "--goal=>=0.5x"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr not empty on a pipe (no progress line expected): %q", stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc bench.FioOutput
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Jobs) != 1 || doc.Jobs[0].JobName != "copy" || len(doc.Baselines) != 1 || len(doc.Baselines[0].Tensorcast) != 2 {
		t.Fatalf("report: %d jobs, %d baselines", len(doc.Jobs), len(doc.Baselines))
	}
	if svg, err := os.ReadFile(plot); err != nil || !strings.HasPrefix(string(svg), "<svg") {
		t.Errorf("plot not written: %v", err)
	}
	stdout.Reset()
	if code := run([]string{"summarize", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("summarize exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "| copy | mem |") || !strings.Contains(stdout.String(), ">=0.5x") {
		t.Errorf("summary: %s", stdout.String())
	}
}

func TestRunErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--name=a", "--bs=4q"}, 2, `command line:2: option "bs"`},
		{[]string{}, 2, "no jobs"},
		{[]string{"--name=a", "--engine=tcp", "--target=p/s", "--daemon=/nonexistent/s.sock"}, 1, "cannot connect to the daemon at /nonexistent/s.sock"},
		{[]string{"--name=a", "--engine=tcp"}, 2, "needs a target"},
		{[]string{"--spawn", "--daemon-bin=/nonexistent/tensorcastd", "--name=a", "--engine=tcp"}, 1, "--daemon-bin"},
		{[]string{"--spawn", "--name=a", "--engine=tcp", "--target=p/s", "--name=b", "--engine=rdma", "--target=p/s"}, 1, "separately"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stderr.String(), c.msg) {
			t.Errorf("run(%q) = %d, stderr %q; want %d and %q", c.args, code, stderr.String(), c.code, c.msg)
		}
	}
}
