package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMetricsFlood runs the soak's metrics flood against a real daemon:
// the fault passes (new control clients served, no failed accept, the
// endpoint back afterwards) and says what it held.
func TestMetricsFlood(t *testing.T) {
	work := t.TempDir()
	bin := filepath.Join(work, "tensorcastd")
	if out, err := exec.Command("go", "build", "-o", bin, "../tensorcastd").CombinedOutput(); err != nil {
		t.Fatalf("building tensorcastd: %v\n%s", err, out)
	}
	key := filepath.Join(work, "cluster.key")
	if err := os.WriteFile(key, []byte("tcsoak metrics flood test key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var ports [3]int
	for i := range ports {
		p, err := freePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	hp := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
	d, err := newDaemon("a", bin, work, key, hp(ports[0]), "b", hp(ports[1]), hp(ports[2]), "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.logf.Close()
	if err := d.start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := d.stop(10 * time.Second); err != nil {
			t.Error(err)
		}
	}()
	what, err := metricsFlood(d, 1500, time.Second)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(d.dir, "daemon.log"))
		t.Fatalf("metrics flood: %v\n%s", err, log)
	}
	if !strings.Contains(what, "1500 idle metrics connections") || strings.Contains(what, " 0 new control clients") {
		t.Fatalf("the fault's report: %s", what)
	}
	t.Log(what)
}
