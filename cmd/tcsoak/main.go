// Command tcsoak runs tensorcastd daemons under mixed load for a while,
// injects faults, and reports what every request ended with, what hung,
// what leaked and what acknowledged writes were lost. Daemons a and b carry
// most of the load; c and d, whose stores are one store across hosts, carry
// the xstore clients (xstore.go), and d shares b's network namespace and
// b's stop, kill and link faults.
//
//	tcsoak -duration 10m [-bin bin/tensorcastd] [-work DIR] [-json report.json]
//
// Load: client processes of each kind (local copies, io_uring files, tcp to
// the other daemon's export, shared-memory queues, writes to a small tmpfs,
// connection churn, the KV store with durable puts) against a and b, and
// the store across hosts (puts on one of c and d, gets of those keys on the
// other) against c and d, restarted when they die. Faults, in turn every -fault-every: a client
// SIGKILLed; daemon b SIGSTOPped and resumed; the link between the daemons
// cut and restored (b runs in its own network namespace); ENOSPC on a's
// file target (the tmpfs filled); EMFILE on a (its RLIMIT_NOFILE lowered to
// what it has open); 1,500 idle connections to a's metrics endpoint while
// new control clients must be served; a hostile tenant's client on a
// (tenant.go); a hitless restart of a from the file descriptor store the
// soak plays for it (hitless.go); daemon b SIGKILLed and restarted, after
// which every write it acknowledged is read back from its file and every
// durable put its store clients logged as acknowledged from its store
// (putcheck.go).
//
// At the end the clients stop, the daemons must go idle (no connections,
// pool blocks, tasks or batches) and are compared with their state before
// the load: file descriptors, RSS, goroutines, segments. Then both get
// SIGTERM and must exit within drain_timeout plus a second. The exit
// status is 1 when anything hung, leaked or was lost.
//
// It needs root for the network namespace, the tmpfs and the rlimit fault;
// without, those faults are skipped and the report says so.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/fdstore"
)

func main() {
	// Client process mode: re-executed by the soak itself.
	kind := flag.String("client", "", "run as a client process of this kind (internal)")
	socket := flag.String("socket", "", "client: the daemon's socket (internal)")
	peer := flag.String("peer", "", "client: the other daemon's id (internal)")
	cdir := flag.String("dir", "", "client: where its files go (internal)")
	id := flag.Int("id", 0, "client: its number (internal)")
	probe := flag.String("probe", "", "hostile client: tenant soak's key (internal)")

	def := 10 * time.Minute
	if v := os.Getenv("SOAK"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			def = d
		}
	}
	duration := flag.Duration("duration", def, "how long the load runs (env SOAK)")
	bin := flag.String("bin", "", "tensorcastd binary (default: tensorcastd beside tcsoak)")
	work := flag.String("work", "", "working directory (default: a new temporary one, removed after a clean run)")
	perKind := flag.Int("clients", 2, "client processes per kind and daemon")
	faultEvery := flag.Duration("fault-every", 20*time.Second, "time between faults")
	jsonOut := flag.String("json", "", "also write the report as JSON here")
	flag.Parse()
	if *kind == "hostile" {
		os.Exit(runHostile(*socket, *peer, *cdir, *probe))
	}
	if *kind != "" {
		os.Exit(runClient(*kind, *socket, *peer, *cdir, *id))
	}
	r, err := soak(*duration, *bin, *work, *perKind, *faultEvery)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tcsoak:", err)
		os.Exit(2)
	}
	r.print(os.Stdout)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "tcsoak:", err)
		}
	}
	if !r.Clean() {
		os.Exit(1)
	}
}

// window is a time a daemon could not answer by design (stopped, killed).
type window struct {
	daemon     string
	start, end time.Time
	// fault names the fault of a window c and d were apart in.
	fault string
}

// Report is what a soak found.
type Report struct {
	Duration     string            `json:"duration"`
	Clients      map[string]int    `json:"client_processes"` // kind@daemon -> incarnations started
	Codes        map[string]uint64 `json:"codes"`            // kind/CODE -> requests
	Faults       []string          `json:"faults"`
	FaultErrors  []string          `json:"fault_errors"` // a fault whose check failed (tenant isolation, a hitless restart, ...)
	Skipped      []string          `json:"skipped"`
	Hangs        []string          `json:"hangs"`
	Leaks        []string          `json:"leaks"`
	Before       map[string]usage  `json:"before"`
	After        map[string]usage  `json:"after"`
	DurableWrite durableReport     `json:"durable_writes"`
	DurablePuts  putReport         `json:"durable_puts"`
	Hitless      hitlessReport     `json:"hitless_restarts"`
	Exit         map[string]string `json:"exit"` // daemon -> how long its SIGTERM took, or the failure
	Corrupt      uint64            `json:"corrupt_reads"`
	// BusyDuringReadBack counts the store clients' BUSY answers for a key
	// the read-back after a kill -9 was reading at the time; BusyOther
	// names the others (the store's own doing: each fails the soak).
	BusyDuringReadBack uint64   `json:"store_busy_during_read_back"`
	BusyOther          []string `json:"store_busy_other,omitempty"`
	// XServed lists the xstore gets that found a key after its removal was
	// acknowledged, with no fault parting c from d near it (xstore.go).
	XServed []string `json:"xstore_served_after_remove,omitempty"`
	// XChecked counts the gets of removed keys that were judged, XExcused
	// those that found the key near a time c and d were apart.
	XChecked uint64 `json:"xstore_removed_checked"`
	XExcused uint64 `json:"xstore_removed_found_near_faults"`
	// XExcusedBy splits XExcused by the fault of the latest parting near
	// each.
	XExcusedBy map[string]uint64 `json:"xstore_removed_found_near_by_fault,omitempty"`
	// XLinger is the longest an excused one was sent after c and d were
	// together again: how long a copy made apart outlived the parting.
	XLinger time.Duration `json:"xstore_removed_linger_ns"`
}

type durableReport struct {
	Acknowledged uint64   `json:"acknowledged"`
	Checks       int      `json:"checks_after_kill"`
	Checked      uint64   `json:"slots_checked"`
	Lost         uint64   `json:"lost"`
	LostAt       []string `json:"lost_at,omitempty"`
}

// putReport is what the reads of acknowledged durable puts after each
// kill -9 found.
type putReport struct {
	Checks      int      `json:"checks_after_kill"`
	Acked       uint64   `json:"acknowledged_at_last_check"`
	Checked     uint64   `json:"read_back"`
	Lost        uint64   `json:"lost"`
	Removed     uint64   `json:"removed_checked"`
	Resurrected uint64   `json:"removed_but_served"`
	LostAt      []string `json:"lost_at,omitempty"`
}

// hitlessReport is what the hitless restarts of a kept.
type hitlessReport struct {
	Restarts  int      `json:"restarts"`
	Committed uint64   `json:"committed_before"`
	ReadBack  uint64   `json:"read_back"`
	Lost      uint64   `json:"lost"`
	LostAt    []string `json:"lost_at,omitempty"`
}

// Clean reports whether nothing hung, leaked, was lost or read back wrong,
// and the single-writer store clients saw BUSY only for a key the soak's
// own read-back was reading then. The clients' counts (their reports) and
// their put logs must agree on that: a BUSY counted and not logged fails.
func (r *Report) Clean() bool {
	busyOK := len(r.BusyOther) == 0 && r.Codes[kindStore+"/BUSY"] <= r.BusyDuringReadBack
	return len(r.Hangs) == 0 && len(r.Leaks) == 0 && len(r.FaultErrors) == 0 && r.DurableWrite.Lost == 0 && r.Corrupt == 0 &&
		r.DurablePuts.Lost == 0 && r.DurablePuts.Resurrected == 0 && busyOK && r.Hitless.Lost == 0 &&
		len(r.XServed) == 0
}

func (r *Report) print(w *os.File) {
	fmt.Fprintf(w, "tcsoak: %s of load\n\nrequests by final code:\n", r.Duration)
	keys := make([]string, 0, len(r.Codes))
	for k := range r.Codes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %-32s %d\n", k, r.Codes[k])
	}
	fmt.Fprintf(w, "\nclient processes started: %v\n", r.Clients)
	fmt.Fprintf(w, "\nfaults injected (%d):\n", len(r.Faults))
	for _, f := range r.Faults {
		fmt.Fprintln(w, "  "+f)
	}
	for _, s := range r.Skipped {
		fmt.Fprintln(w, "  skipped: "+s)
	}
	list := func(name string, xs []string) {
		fmt.Fprintf(w, "\n%s: %d\n", name, len(xs))
		for _, x := range xs {
			fmt.Fprintln(w, "  "+x)
		}
	}
	list("faults whose check failed", r.FaultErrors)
	list("hangs past the deadline", r.Hangs)
	list("leaks", r.Leaks)
	for _, d := range []string{"a", "b", "c", "d"} {
		fmt.Fprintf(w, "  %s before: %+v\n  %s after:  %+v\n", d, r.Before[d], d, r.After[d])
	}
	dw := r.DurableWrite
	fmt.Fprintf(w, "\nacknowledged durable file writes: %d; checked after %d kill -9: %d slots, lost %d\n", dw.Acknowledged, dw.Checks, dw.Checked, dw.Lost)
	dp := r.DurablePuts
	fmt.Fprintf(w, "acknowledged durable puts: read back after %d kill -9: %d (%d acknowledged at the last), lost %d; "+
		"acknowledged removes checked: %d, served again %d\n", dp.Checks, dp.Checked, dp.Acked, dp.Lost, dp.Removed, dp.Resurrected)
	for _, l := range dp.LostAt {
		fmt.Fprintln(w, "  "+l)
	}
	fmt.Fprintf(w, "store BUSY answers (single-writer clients): %d; for a key the read-back after a kill -9 was reading then: %d; "+
		"otherwise (the store's own doing): %d\n", r.Codes[kindStore+"/BUSY"], r.BusyDuringReadBack, len(r.BusyOther))
	for _, x := range r.BusyOther {
		fmt.Fprintln(w, "  "+x)
	}
	hr := r.Hitless
	fmt.Fprintf(w, "hitless restarts of a: %d; L1 values committed before them: %d, read back byte-exact after: %d, lost %d\n",
		hr.Restarts, hr.Committed, hr.ReadBack, hr.Lost)
	for _, l := range hr.LostAt {
		fmt.Fprintln(w, "  "+l)
	}
	fmt.Fprintf(w, "corrupt read-backs: %d\n", r.Corrupt)
	fmt.Fprintf(w, "xstore gets of keys removed at least %v before: %d keys judged; found again near c and d being apart: %d "+
		"(the latest sent %v after they were together again), with no such fault near: %d\n", xstoreGoneAfter, r.XChecked,
		r.XExcused, r.XLinger.Round(time.Millisecond), len(r.XServed))
	if len(r.XExcusedBy) > 0 {
		fmt.Fprintf(w, "  found again by the fault of the latest parting near: %v\n", r.XExcusedBy)
	}
	for _, x := range r.XServed {
		fmt.Fprintln(w, "  "+x)
	}
	fmt.Fprintf(w, "exit on SIGTERM: %v\n", r.Exit)
	if r.Clean() {
		fmt.Fprintln(w, "\nresult: 0 hangs, 0 leaks, 0 lost, 0 failed faults")
	} else {
		fmt.Fprintln(w, "\nresult: FAILED")
	}
}

// soak is the whole run.
func soak(duration time.Duration, bin, work string, perKind int, faultEvery time.Duration) (*Report, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if bin == "" {
		bin = filepath.Join(filepath.Dir(self), "tensorcastd")
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("tensorcastd binary: %w (build it, or pass -bin)", err)
	}
	keep := work != ""
	if work == "" {
		if work, err = os.MkdirTemp("", "tcsoak"); err != nil {
			return nil, err
		}
	} else if err := emptyDir(work); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	// Open to the hostile tenant's client (another uid), which must reach
	// a's socket under it; MkdirTemp makes it 0700.
	if err := os.Chmod(work, 0o755); err != nil {
		return nil, err
	}
	r := &Report{Duration: duration.String(), Clients: map[string]int{}, Codes: map[string]uint64{},
		Before: map[string]usage{}, After: map[string]usage{}, Exit: map[string]string{}}

	key := filepath.Join(work, "cluster.key")
	if err := os.WriteFile(key, []byte("tcsoak cluster key "+strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, err
	}
	net, err := setupNetwork()
	if err != nil {
		return nil, err
	}
	defer net.teardown()
	if net.ns == "" {
		r.Skipped = append(r.Skipped, "link cut: "+net.why)
	}
	// The ENOSPC target: a small tmpfs that the fault fills.
	enospcDir := filepath.Join(work, "enospc")
	if err := os.MkdirAll(enospcDir, 0o755); err != nil {
		return nil, err
	}
	haveTmpfs := false
	if os.Geteuid() == 0 {
		if err := unix.Mount("tcsoak", enospcDir, "tmpfs", 0, "size=48m"); err == nil {
			haveTmpfs = true
			defer unix.Unmount(enospcDir, unix.MNT_DETACH)
		} else {
			r.Skipped = append(r.Skipped, "ENOSPC: mounting a tmpfs: "+err.Error())
		}
	} else {
		r.Skipped = append(r.Skipped, "ENOSPC: not root: no tmpfs to fill")
	}

	// ports picks a daemon's peer and metrics ports: fixed ones in b's
	// namespace (it is its own: any port is free there), else free ones on
	// the host.
	ports := func(addr string, inNS bool, nsPort, nsMetrics int) (int, int, error) {
		if inNS {
			return nsPort, nsMetrics, nil
		}
		port, err := freePort(addr)
		if err != nil {
			return 0, 0, err
		}
		metrics, err := freePort("127.0.0.1")
		return port, metrics, err
	}
	portA, metricsA, err := ports(net.addrA, false, 0, 0)
	if err != nil {
		return nil, err
	}
	portB, metricsB, err := ports(net.addrB, net.ns != "", 7481, 9481)
	if err != nil {
		return nil, err
	}
	hostPort := func(h string, p int) string { return h + ":" + strconv.Itoa(p) }
	metricsHostB := "127.0.0.1"
	if net.ns != "" {
		metricsHostB = net.addrB
	}
	// a's journal records every L1 value, so that a hitless restart keeps
	// all the fault's own (its default holds one per 16 KiB of L1).
	a, err := newDaemon("a", bin, work, key, hostPort(net.addrA, portA), "b", hostPort(net.addrB, portB),
		hostPort("127.0.0.1", metricsA), "", []string{fmt.Sprintf("allowed_files = [%q]", enospcDir),
			"store_l1_journal_records = 65536"}, tenantConfig(true, filepath.Join(work, "a", "data"), enospcDir))
	if err != nil {
		return nil, err
	}
	// a runs as under systemd with a file descriptor store (the
	// hitless-restart fault).
	if a.fds, err = fdstore.Listen(filepath.Join(a.dir, "notify.sock")); err != nil {
		return nil, err
	}
	defer a.fds.Close()
	b, err := newDaemon("b", bin, work, key, hostPort(net.addrB, portB), "a", hostPort(net.addrA, portA),
		hostPort(metricsHostB, metricsB), net.ns, nil, tenantConfig(false, filepath.Join(work, "b", "data")))
	if err != nil {
		return nil, err
	}
	// c and d are a pair whose stores are one store across hosts (no
	// [[tenants]]: a tenant's store is its host's alone), for the xstore
	// clients. d lives in b's network namespace, so the link cut parts it
	// from c, and b's stop and kill faults stop and kill d with it.
	portC, metricsC, err := ports(net.addrA, false, 0, 0)
	if err != nil {
		return nil, err
	}
	portD, metricsD, err := ports(net.addrB, net.ns != "", portB+1, metricsB+1)
	if err != nil {
		return nil, err
	}
	xc, err := newDaemon("c", bin, work, key, hostPort(net.addrA, portC), "d", hostPort(net.addrB, portD),
		hostPort("127.0.0.1", metricsC), "", nil, nil)
	if err != nil {
		return nil, err
	}
	xd, err := newDaemon("d", bin, work, key, hostPort(net.addrB, portD), "c", hostPort(net.addrA, portC),
		hostPort(metricsHostB, metricsD), net.ns, nil, nil)
	if err != nil {
		return nil, err
	}
	xdir := filepath.Join(work, "xstore")
	if err := os.MkdirAll(xdir, 0o755); err != nil {
		return nil, err
	}
	daemons := map[string]*daemon{"a": a, "b": b, "c": xc, "d": xd}
	for _, d := range []*daemon{a, b, xc, xd} {
		if err := d.start(); err != nil {
			return nil, err
		}
		defer d.kill()
	}

	stopAll := make(chan struct{})
	var bg sync.WaitGroup
	// The export the tcp clients of a open on b, held by a client of b
	// and made again after b restarts.
	bg.Add(1)
	go func() {
		defer bg.Done()
		exporter(b, stopAll)
	}()
	if err := waitExport(a, "b/soak-kv", 30*time.Second); err != nil {
		return nil, err
	}
	time.Sleep(time.Second) // the peers' sessions settle before the baseline
	for n, d := range daemons {
		u, err := d.measure()
		if err != nil {
			return nil, fmt.Errorf("measuring %s before the load: %w", n, err)
		}
		r.Before[n] = u
	}
	du := newDurable(b)
	bg.Add(1)
	go func() {
		defer bg.Done()
		du.run(stopAll)
	}()

	// The clients, restarted whenever they die.
	type slot struct {
		kind string
		d    *daemon
		dir  string
		peer string
	}
	var slots []slot
	for _, d := range []*daemon{a, b} {
		other := "b"
		if d == b {
			other = "a"
		}
		for _, k := range []string{kindLocal, kindURing, kindQueue, kindChurn, kindStore} {
			dir := filepath.Join(d.dir, "data")
			if k == kindStore {
				dir = putLogDir(d)
			}
			for range perKind {
				slots = append(slots, slot{k, d, dir, other})
			}
		}
	}
	for range perKind {
		slots = append(slots, slot{kindXStore, xc, xdir, "d"}, slot{kindXStore, xd, xdir, "c"})
	}
	for range perKind {
		slots = append(slots, slot{kindTCP, a, "", "b"})
		if haveTmpfs {
			slots = append(slots, slot{kindENOSPC, a, enospcDir, "b"})
		}
	}
	for _, d := range []*daemon{a, b} {
		if err := os.MkdirAll(putLogDir(d), 0o755); err != nil {
			return nil, err
		}
	}
	pc := &putCheck{d: b, dir: putLogDir(b)}
	hl := &hitless{d: a}
	tenantRounds := 0

	var mu sync.Mutex // guards procs, ended, r.Clients, windows
	procs := make([]*proc, len(slots))
	var ended []*proc
	var windows []window
	var apart []window // c and d parted: d stopped, dead or cut off (guarded by mu)
	nextID := 0
	launch := func(i int) {
		s := slots[i]
		nextID++
		p, err := startClient(self, s.kind, s.d, s.peer, s.dir, nextID)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tcsoak: starting a client:", err)
			return
		}
		procs[i] = p
		r.Clients[s.kind+"@"+s.d.name]++
	}
	mu.Lock()
	for i := range slots {
		launch(i)
	}
	mu.Unlock()
	// The supervisor restarts clients that died (killed, or crashed).
	bg.Add(1)
	go func() {
		defer bg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopAll:
				return
			case <-t.C:
			}
			mu.Lock()
			for i, p := range procs {
				if p == nil {
					launch(i)
					continue
				}
				select {
				case <-p.done:
					ended = append(ended, p)
					launch(i)
				default:
				}
			}
			mu.Unlock()
		}
	}()

	// Faults, in turn.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	type fault struct {
		name string
		run  func() (string, error)
	}
	hold := 5 * time.Second
	faults := []fault{
		{"client SIGKILL", func() (string, error) {
			mu.Lock()
			i := rng.IntN(len(procs))
			p := procs[i]
			mu.Unlock()
			if p == nil {
				return "no client to kill", nil
			}
			p.kill()
			return fmt.Sprintf("killed %s client %d of %s", p.kind, p.id, p.d.name), nil
		}},
		{"peer SIGSTOP", func() (string, error) {
			start := time.Now()
			if err := b.signal(syscall.SIGSTOP); err != nil {
				return "", err
			}
			if err := xd.signal(syscall.SIGSTOP); err != nil {
				return "", errors.Join(err, b.signal(syscall.SIGCONT))
			}
			time.Sleep(hold)
			err := errors.Join(b.signal(syscall.SIGCONT), xd.signal(syscall.SIGCONT))
			mu.Lock()
			windows = append(windows, window{daemon: "b", start: start, end: time.Now()}, window{daemon: "d", start: start, end: time.Now()})
			apart = append(apart, window{"d", start, time.Now(), "peer SIGSTOP"})
			mu.Unlock()
			return fmt.Sprintf("b and d stopped for %v", hold), err
		}},
		{"link cut", func() (string, error) {
			if net.ns == "" {
				return "skipped: " + net.why, nil
			}
			start := time.Now()
			if err := net.link(false); err != nil {
				return "", err
			}
			time.Sleep(hold)
			err := net.link(true)
			mu.Lock()
			apart = append(apart, window{"d", start, time.Now(), "link cut"})
			mu.Unlock()
			return fmt.Sprintf("link a<->b and c<->d down for %v", hold), err
		}},
		{"ENOSPC", func() (string, error) {
			if !haveTmpfs {
				return "skipped: no tmpfs", nil
			}
			n, err := fill(filepath.Join(enospcDir, "filler"))
			time.Sleep(hold)
			os.Remove(filepath.Join(enospcDir, "filler"))
			return fmt.Sprintf("a's file target full (%d MiB filler) for %v", n>>20, hold), err
		}},
		{"EMFILE", func() (string, error) {
			if os.Geteuid() != 0 {
				return "skipped: not root", nil
			}
			return emfile(a, hold)
		}},
		{"metrics flood", func() (string, error) { return metricsFlood(a, 1500, hold) }},
		{"tenant", func() (string, error) {
			if os.Geteuid() != 0 {
				return "skipped: not root (the hostile tenant's client runs as another uid)", nil
			}
			tenantRounds++
			return tenantFault(self, a, "b", filepath.Join(a.dir, "data"), tenantRounds)
		}},
		{"hitless restart", func() (string, error) {
			start := time.Now()
			hl.mu.Lock()
			kill := hl.restarts%2 == 1
			hl.mu.Unlock()
			what, err := hl.run(kill)
			mu.Lock()
			windows = append(windows, window{daemon: "a", start: start, end: time.Now()})
			mu.Unlock()
			return what, err
		}},
		{"peer SIGKILL", func() (string, error) {
			start := time.Now()
			b.kill()
			xd.kill()
			err := du.check()
			snap, removed, serr := pc.snapshot()
			if serr != nil {
				return "", serr
			}
			time.Sleep(time.Second)
			if serr := b.start(); serr != nil {
				return "", serr
			}
			restarted := time.Since(start)
			if perr := pc.verify(snap, removed); err == nil {
				err = perr
			}
			if serr := xd.start(); err == nil {
				err = serr
			}
			mu.Lock()
			windows = append(windows, window{daemon: "b", start: start, end: time.Now()}, window{daemon: "d", start: start, end: time.Now()})
			apart = append(apart, window{"d", start, time.Now(), "peer SIGKILL"})
			mu.Unlock()
			// b's and d's baselines stay their first start's: their
			// clients are back already, which would hide what they leak.
			return fmt.Sprintf("b and d killed, b restarted in %v; acknowledged file writes and durable puts read back",
				restarted.Round(time.Millisecond)), err
		}},
	}
	end := time.Now().Add(duration)
	next := 0
	for time.Until(end) > 0 {
		wait := min(faultEvery, time.Until(end))
		time.Sleep(wait)
		if time.Until(end) <= 0 {
			break
		}
		f := faults[next%len(faults)]
		next++
		at := time.Now()
		what, err := f.run()
		line := fmt.Sprintf("%s %s: %s", at.Format("15:04:05"), f.name, what)
		if err != nil {
			line += " (error: " + err.Error() + ")"
			r.FaultErrors = append(r.FaultErrors, line)
		}
		r.Faults = append(r.Faults, line)
	}

	// Stop: no new clients, ask every client to finish, then stop the
	// in-process ones.
	close(stopAll)
	bg.Wait()
	mu.Lock()
	all := append(ended, procs...)
	mu.Unlock()
	var fw sync.WaitGroup
	for _, p := range all {
		if p == nil {
			continue
		}
		fw.Add(1)
		go func() {
			defer fw.Done()
			p.finish(opTimeout + hangGrace + 5*time.Second)
		}()
	}
	fw.Wait()
	for _, p := range all {
		if p == nil {
			continue
		}
		rep := p.report()
		for k, v := range rep.Codes {
			r.Codes[k] += v
			if strings.HasSuffix(k, "/CORRUPT") {
				r.Corrupt += v
			}
		}
		for _, x := range rep.Served {
			if near, after, fault := nearApart(apart, x); near {
				r.XExcused++
				if r.XExcusedBy == nil {
					r.XExcusedBy = map[string]uint64{}
				}
				r.XExcusedBy[fault]++
				r.XLinger = max(r.XLinger, after)
			} else {
				r.XServed = append(r.XServed, fmt.Sprintf("xstore client %d of %s: %s, removed at %s, found by a get from %s to %s",
					p.id, p.d.name, x.Key, time.UnixMilli(x.RemovedAt).Format("15:04:05.000"),
					time.UnixMilli(x.Start).Format("15:04:05.000"), time.UnixMilli(x.End).Format("15:04:05.000")))
			}
		}
		for _, l := range rep.Late {
			if excused(windows, p, l) {
				continue
			}
			r.Hangs = append(r.Hangs, fmt.Sprintf("%s client %d of %s: %s from %s, %s", p.kind, p.id, p.d.name, l.What,
				time.UnixMilli(l.Start).Format("15:04:05.000"), lateFor(l)))
		}
	}
	du.mu.Lock()
	r.DurableWrite = durableReport{Acknowledged: du.writes, Checks: du.checks, Checked: du.checked, Lost: du.lost, LostAt: du.lostAt}
	du.mu.Unlock()
	hl.mu.Lock()
	r.Hitless = hitlessReport{Restarts: hl.restarts, Committed: hl.committed, ReadBack: hl.readBack, Lost: hl.lost, LostAt: hl.lostAt}
	hl.mu.Unlock()
	pc.mu.Lock()
	r.DurablePuts = putReport{Checks: pc.checks, Acked: pc.acked, Checked: pc.checked, Lost: pc.lost, Removed: pc.removedSeen,
		Resurrected: pc.resurrected, LostAt: pc.lostAt}
	reads := pc.reads
	pc.mu.Unlock()
	// Which of the store clients' BUSY answers had a second caller on the
	// key: b's read-back after a kill -9 (no other caller touches their
	// keys). a has none.
	for _, d := range []*daemon{a, b} {
		bs, err := busyAnswers(putLogDir(d))
		if err != nil {
			return nil, err
		}
		var during int
		other := bs
		if d == b {
			during, other = busyDuringReads(bs, reads)
		}
		r.BusyDuringReadBack += uint64(during)
		for _, x := range other {
			r.BusyOther = append(r.BusyOther, fmt.Sprintf("%s: %s at %s", d.name, x.key, x.at.Format("15:04:05.000")))
		}
	}

	// The xstore clients must have read values across hosts: a soak whose
	// gets across hosts all missed tested nothing of that path.
	if r.Codes[kindXStore+"/get-OK"] == 0 {
		r.FaultErrors = append(r.FaultErrors, "xstore: no get found a value the other daemon put: the store across hosts was not exercised")
	}
	for k, v := range r.Codes {
		if strings.HasPrefix(k, kindXStore+"/get-removed-") {
			r.XChecked += v
		}
	}
	if r.XChecked == 0 {
		r.FaultErrors = append(r.FaultErrors, "xstore: no get asked for a removed key: removals across hosts were not checked")
	}

	// Idle, then compare.
	for n, d := range daemons {
		u, err := waitIdle(d, 30*time.Second)
		r.After[n] = u
		if err != nil {
			r.Leaks = append(r.Leaks, fmt.Sprintf("%s: %v", n, err))
		}
		r.Leaks = append(r.Leaks, compare(n, r.Before[n], u)...)
	}
	for n, d := range daemons {
		took, err := d.stop(3*time.Second + 5*time.Second)
		switch {
		case err != nil:
			r.Exit[n] = err.Error()
			r.Hangs = append(r.Hangs, n+": "+err.Error())
		case took > 3*time.Second+time.Second:
			r.Exit[n] = took.Round(time.Millisecond).String()
			r.Hangs = append(r.Hangs, fmt.Sprintf("%s: SIGTERM took %v, over drain_timeout 3s plus 1s", n, took.Round(time.Millisecond)))
		default:
			r.Exit[n] = took.Round(time.Millisecond).String()
		}
	}
	if r.Clean() && !keep {
		defer os.RemoveAll(work)
	} else {
		fmt.Fprintf(os.Stderr, "tcsoak: daemon logs in %s/{a,b,c,d}/daemon.log\n", work)
	}
	return r, nil
}

// emptyDir checks that dir, a working directory given, is absent or
// empty: a run's daemons keep their stores, put logs and logs there, and
// an earlier run's would be read as this one's (a tenant's probe key
// found in its own store, put logs of puts never made now).
func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case len(ents) > 0:
		return fmt.Errorf("working directory %s is not empty (%d entries, %s first): an earlier run's stores and logs would be read as this run's; give a new one", dir, len(ents), ents[0].Name())
	}
	return nil
}

// apartGrace is how long before a removal a fault that parted c from d
// still excuses a copy found after it: a copy made while they were apart
// is unknown to its key's home until the daemons meet again (a probe a
// second) and re-announce it (50,000 keys a second), and the key itself
// was put up to a second or so before its removal.
const apartGrace = 10 * time.Second

// nearApart reports whether a get that found a removed key came near a
// time c and d were apart: from apartGrace before the removal to the
// get's answer. If so, it also returns how long after the last such time
// ended the get was sent (0 when it was sent while they were apart), and
// that time's fault.
func nearApart(ws []window, x servedOp) (bool, time.Duration, string) {
	from, to := time.UnixMilli(x.RemovedAt).Add(-apartGrace), time.UnixMilli(x.End)
	near, last, fault := false, time.Time{}, ""
	for _, w := range ws {
		if w.start.Before(to) && w.end.After(from) {
			near = true
			if w.end.After(last) {
				last, fault = w.end, w.fault
			}
		}
	}
	if !near {
		return false, 0, ""
	}
	return true, max(0, time.UnixMilli(x.Start).Sub(last)), fault
}

// putLogDir is where the store clients of d write their put logs.
func putLogDir(d *daemon) string { return filepath.Join(d.dir, "putlogs") }

// excused reports whether a late call overlapped a time its daemon was
// stopped or dead on purpose (a call to a frozen daemon waits for it by
// design; calls that cross to the other daemon must not).
func excused(ws []window, p *proc, l lateOp) bool {
	end := time.UnixMilli(l.End)
	if l.End == 0 {
		end = time.Now()
	}
	start := time.UnixMilli(l.Start)
	for _, w := range ws {
		if w.daemon == p.d.name && start.Before(w.end.Add(hangGrace)) && end.After(w.start) {
			return true
		}
	}
	return false
}

func lateFor(l lateOp) string {
	if l.End == 0 {
		return "still out when reported"
	}
	return "took " + time.UnixMilli(l.End).Sub(time.UnixMilli(l.Start)).Round(time.Millisecond).String()
}

// exporter keeps "soak-kv", a 16 MiB buffer of b, exported.
func exporter(b *daemon, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		c, err := client.Dial(b.socket, client.Options{Name: "tcsoak-exporter", NoPool: true, CallTimeout: 10 * time.Second})
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		buf, err := c.RegisterBuffer(16 << 20)
		if err == nil {
			_, err = c.ExportSegment("soak-kv", buf.ID, 0, 0, client.RightRead|client.RightWrite)
		}
		for err == nil {
			select {
			case <-stop:
				c.Close()
				return
			case <-time.After(500 * time.Millisecond):
			}
			err = c.Ping(nil)
		}
		c.Close()
	}
}

// waitExport waits until a client of d can open name.
func waitExport(d *daemon, name string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := client.Dial(d.socket, client.Options{Name: "tcsoak-probe", NoPool: true, CallTimeout: 10 * time.Second})
		if err == nil {
			_, err = c.OpenRemote(name, client.RightRead)
			c.Close()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not reachable from %s: %v", name, d.name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitIdle waits until d holds nothing for any client and returns its
// usage then.
func waitIdle(d *daemon, limit time.Duration) (usage, error) {
	deadline := time.Now().Add(limit)
	for {
		u, err := d.measure()
		if err == nil && u.Connections == 0 && u.clientPool() == 0 && u.Waiting+u.Pending == 0 && u.Batches == 0 &&
			u.StorePins == 0 && u.StoreRsv == 0 {
			return u, nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("not idle %v after the clients left: %+v", limit, u)
			}
			return u, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// compare names what grew between an idle daemon before and after the load,
// beyond what a warm process may grow (its heap, its peer sessions).
func compare(name string, before, after usage) []string {
	var out []string
	check := func(what string, b, a, slack uint64) {
		if a > b+slack {
			out = append(out, fmt.Sprintf("%s: %s %d before, %d after (slack %d)", name, what, b, a, slack))
		}
	}
	check("open fds", uint64(before.FDs), uint64(after.FDs), 8)
	check("goroutines", uint64(before.Goroutines), uint64(after.Goroutines), 16)
	check("segments", before.Segments, after.Segments, 0)
	check("pool bytes held for clients", 0, after.clientPool(), 0)
	check("tasks", 0, after.Waiting+after.Pending, 0)
	check("batches", 0, after.Batches, 0)
	check("store pins", 0, uint64(after.StorePins), 0)
	check("store reservations", 0, uint64(after.StoreRsv), 0)
	check("RSS KiB", before.RSSKiB, after.RSSKiB, before.RSSKiB+256<<10)
	return out
}

// fill writes zeros to path until the file system is full; it returns
// how much it wrote.
func fill(path string) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, err := f.Write(buf)
		n += int64(k)
		if err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return n, nil
			}
			return n, err
		}
	}
}

// emfile lowers d's RLIMIT_NOFILE to what it has open for hold, so every
// accept and open fails with EMFILE, then gives it back.
func emfile(d *daemon, hold time.Duration) (string, error) {
	pid := d.pid()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return "", err
	}
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		return "", fmt.Errorf("prlimit: %w", err)
	}
	// Below 3 every fd is taken (stdin, stdout, stderr): no new one can be
	// had, whatever holes there are above.
	lim := unix.Rlimit{Cur: 3, Max: old.Max}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		return "", fmt.Errorf("prlimit: %w", err)
	}
	time.Sleep(hold)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil); err != nil {
		return "", fmt.Errorf("prlimit restore: %w", err)
	}
	// A new client is served again.
	c, err := client.Dial(d.socket, client.Options{Name: "tcsoak-after-emfile", NoPool: true, CallTimeout: 10 * time.Second})
	if err == nil {
		err = c.Ping(nil)
		c.Close()
	}
	return fmt.Sprintf("a (%d fds open) allowed no new fd for %v, then served a new client", len(ents), hold), err
}
