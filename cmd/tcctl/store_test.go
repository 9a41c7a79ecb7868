package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
)

// startStoreDaemon is startDaemon with a DRAM-only store; more add to
// the deps with it.
func startStoreDaemon(t *testing.T, more ...func(*control.Deps, *store.Store)) string {
	t.Helper()
	return startDaemonDeps(t, func(d *control.Deps) {
		s, err := store.New(store.Config{}, d.Pool.(*shm.Pool), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		d.Store = s
		for _, f := range more {
			f(d, s)
		}
	})
}

// tcctlOn runs tcctl against the daemon at sock: run(wantCode, args...)
// fails the test unless tcctl exits with wantCode, and returns its stdout
// and stderr.
func tcctlOn(t *testing.T, sock string) func(wantCode int, args ...string) (string, string) {
	return func(wantCode int, args ...string) (string, string) {
		t.Helper()
		code, out, errs := tcctl(t, nil, append([]string{"--socket", sock}, args...)...)
		if code != wantCode {
			t.Fatalf("tcctl %v: exit %d, want %d (stdout %q, stderr %q)", args, code, wantCode, out, errs)
		}
		return out, errs
	}
}

// TestStoreCommands: put, get, rm, ls and stat exit 0 only on success,
// and print the status code's name otherwise; the store's figures show in
// stats.
func TestStoreCommands(t *testing.T) {
	sock := startStoreDaemon(t)
	run := tcctlOn(t, sock)
	dir := t.TempDir()
	file := filepath.Join(dir, "v.bin")
	val := bytes.Repeat([]byte("tensorcast "), 5000)
	if err := os.WriteFile(file, val, 0o600); err != nil {
		t.Fatal(err)
	}
	run(0, "put", "model/blk/1", file)
	stdin = strings.NewReader("from stdin")
	defer func() { stdin = os.Stdin }()
	run(0, "put", "model/blk/2", "-")
	if _, errs := run(1, "put", "model/blk/1", file); !strings.Contains(errs, "put model/blk/1: ALREADY_EXISTS") {
		t.Fatalf("put of an existing key: %q", errs)
	}
	if _, errs := run(1, "put", "--durable", "model/blk/3", file); !strings.Contains(errs, "FAILED_PRECONDITION") {
		t.Fatalf("durable put without L2: %q", errs)
	}
	if _, errs := run(1, "put", "empty", os.DevNull); !strings.Contains(errs, "INVALID_ARGUMENT") {
		t.Fatalf("put of an empty value: %q", errs)
	}
	run(2, "put", "only-a-key")

	if out, _ := run(0, "get", "model/blk/1"); out != string(val) {
		t.Fatalf("get to stdout: %d bytes", len(out))
	}
	dst := filepath.Join(dir, "out.bin")
	run(0, "get", "model/blk/2", dst)
	if b, err := os.ReadFile(dst); err != nil || string(b) != "from stdin" {
		t.Fatalf("get to a file: %q %v", b, err)
	}
	if _, errs := run(1, "get", "absent"); !strings.Contains(errs, "get absent: NOT_FOUND") {
		t.Fatalf("get of an absent key: %q", errs)
	}

	out, _ := run(0, "stat", "model/blk/1")
	for _, want := range []string{"size:       55000", "tier:       l1", "pins:       0"} {
		if !strings.Contains(out, want) {
			t.Fatalf("stat lacks %q: %q", want, out)
		}
	}
	if _, errs := run(1, "stat", "absent"); !strings.Contains(errs, "NOT_FOUND") {
		t.Fatalf("stat of an absent key: %q", errs)
	}
	run(0, "put", "other", file)
	out, _ = run(0, "ls", "--prefix", "model/")
	if !strings.Contains(out, "model/blk/1") || !strings.Contains(out, "model/blk/2") || strings.Contains(out, "other") ||
		!strings.Contains(out, "55000") {
		t.Fatalf("ls --prefix: %q", out)
	}
	if out, _ = run(0, "ls"); !strings.Contains(out, "other") {
		t.Fatalf("ls: %q", out)
	}

	// A key another client pins cannot be removed: rm says which and why.
	c, err := client.Dial(sock, client.Options{Name: "pinner"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.StorePin([][]byte{[]byte("other")}, 0, make([]error, 1)); err != nil {
		t.Fatal(err)
	}
	if out, _ := run(0, "stat", "other"); !strings.Contains(out, "pins:       1") {
		t.Fatalf("stat of a pinned key: %q", out)
	}
	if _, errs := run(1, "rm", "model/blk/1", "other", "absent"); !strings.Contains(errs, "rm other: FAILED_PRECONDITION") ||
		strings.Contains(errs, "rm model/blk/1") || strings.Contains(errs, "rm absent") {
		t.Fatalf("rm with a pinned key: %q", errs)
	}
	run(1, "get", "model/blk/1")
	run(0, "rm", "absent")
	run(2, "rm")

	out, _ = run(0, "stats")
	if !strings.Contains(out, "store.keys 2\n") || !strings.Contains(out, "store.pins 1\n") {
		t.Fatalf("stats lacks the store: %q", out)
	}
	out, _ = run(0, "stats", "--json")
	var js statsJSON
	if err := json.Unmarshal([]byte(out), &js); err != nil || js.Store["keys"] != 2 {
		t.Fatalf("stats --json: %v %v", err, js.Store)
	}
}

// TestStoreCommandsWithoutStore: a daemon without a store answers
// UNAVAILABLE, and the commands say so.
func TestStoreCommandsWithoutStore(t *testing.T) {
	sock := startDaemon(t)
	code, _, errs := tcctl(t, nil, "--socket", sock, "stat", "k")
	if code != 1 || !strings.Contains(errs, "stat k: UNAVAILABLE") {
		t.Fatalf("stat without a store: %d %q", code, errs)
	}
}

func plainOf(name string, typ dto.MetricType, v float64, labels ...string) *dto.Metric {
	m := &dto.Metric{}
	for i := 0; i < len(labels); i += 2 {
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(labels[i]), Value: proto.String(labels[i+1])})
	}
	if typ == dto.MetricType_COUNTER {
		m.Counter = &dto.Counter{Value: proto.Float64(v)}
	} else {
		m.Gauge = &dto.Gauge{Value: proto.Float64(v)}
	}
	return m
}

func famOf(name string, typ dto.MetricType, ms ...*dto.Metric) *dto.MetricFamily {
	return &dto.MetricFamily{Name: proto.String(name), Type: typ.Enum(), Metric: ms}
}

// TestRenderStore: top's store row shows keys, tier bytes, pins and the
// rates of promotions, writebacks and evictions over the interval.
func TestRenderStore(t *testing.T) {
	g, c := dto.MetricType_GAUGE, dto.MetricType_COUNTER
	snap := func(at time.Time, promos, evicts float64) *snapshot {
		return &snapshot{at: at, fams: map[string]*dto.MetricFamily{
			"tensorcast_store_keys": famOf("tensorcast_store_keys", g, plainOf("", g, 1234)),
			"tensorcast_store_tier_bytes": famOf("tensorcast_store_tier_bytes", g, plainOf("", g, 5e6, "tier", "l1"),
				plainOf("", g, 7e6, "tier", "l2")),
			"tensorcast_store_pins":             famOf("tensorcast_store_pins", g, plainOf("", g, 3)),
			"tensorcast_store_promotions_total": famOf("tensorcast_store_promotions_total", c, plainOf("", c, promos)),
			"tensorcast_store_evictions_total": famOf("tensorcast_store_evictions_total", c, plainOf("", c, evicts, "tier", "l1"),
				plainOf("", c, 0, "tier", "l2")),
		}}
	}
	t0 := time.Unix(1000, 0)
	var out strings.Builder
	render(&out, snap(t0, 10, 0), snap(t0.Add(2*time.Second), 110, 40), "test", 2)
	row := regexp.MustCompile(`(?m)^\s*store\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+\S+\s+(\S+)\s+\S+\s+(\S+)`).FindStringSubmatch(out.String())
	if row == nil {
		t.Fatalf("no store row:\n%s", out.String())
	}
	if row[1] != "1234" || row[2] != "5.0" || row[3] != "7.0" || row[4] != "3" || row[5] != "50" || row[6] != "20" {
		t.Fatalf("store row %q:\n%s", row[1:], out.String())
	}
}
