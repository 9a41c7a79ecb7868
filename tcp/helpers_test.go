package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// exporter serves named segments and records notifications.
type exporter struct {
	mu       sync.Mutex
	segs     map[string]*xfertest.Segment // by exportKey
	grants   map[string][]string          // the other tenants each export grants
	rights   map[string]Rights            // what each export grants now (read and write when absent)
	notes    []string                     // "segment:payload"
	deliver  func(seg string, payload []byte) error
	notifyCh chan string
	// stall, when set, makes the next Lookup sleep that long (stalling an
	// event loop of the owner); stalled has a value once that sleep began.
	stall   atomic.Int64
	stalled chan struct{}
	// hold, when set, makes the next Lookup wait until it is closed (an
	// event loop of the owner stopped until the test says).
	hold atomic.Pointer[chan struct{}]
}

func newExporter() *exporter {
	return &exporter{segs: map[string]*xfertest.Segment{}, grants: map[string][]string{}, rights: map[string]Rights{},
		notifyCh: make(chan string, 64), stalled: make(chan struct{}, 1)}
}

// only exports the default tenant's name with rights alone (read and
// write when never said).
func (e *exporter) only(name string, rights Rights) {
	e.mu.Lock()
	e.rights[exportKey("", name)] = rights
	e.mu.Unlock()
}

func (e *exporter) add(name string, s *xfertest.Segment) { e.addAs("", name, s) }

// addAs exports s as name of tenant, granting it to the tenants grants
// too.
func (e *exporter) addAs(tenant, name string, s *xfertest.Segment, grants ...string) {
	e.mu.Lock()
	e.segs[exportKey(tenant, name)] = s
	e.grants[exportKey(tenant, name)] = grants
	e.mu.Unlock()
}

// exportKey is where an export of tenant ("": the default) is kept.
func exportKey(tenant, name string) string {
	if tenant == "" {
		return name
	}
	return tenant + "/" + name
}

// errNotGranted is the test exporter's refusal of another tenant.
var errNotGranted = fmt.Errorf("%w: not granted", xfer.ErrPermission)

func (e *exporter) Lookup(a Access) (xfer.MemSegment, Rights, error) {
	if h := e.hold.Swap(nil); h != nil {
		<-*h
	}
	if d := e.stall.Swap(0); d > 0 {
		select {
		case e.stalled <- struct{}{}:
		default:
		}
		time.Sleep(time.Duration(d)) // the fault: an event loop of the owner stops this long
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	owner := a.Owner
	if owner == "" {
		owner = a.Tenant
	}
	k := exportKey(owner, a.Name)
	if owner != a.Tenant && !slices.Contains(e.grants[k], a.Tenant) {
		return nil, 0, errNotGranted
	}
	if s, ok := e.segs[k]; ok {
		if r, ok := e.rights[k]; ok {
			return s, r, nil
		}
		return s, RightRead | RightWrite, nil
	}
	return nil, 0, errors.New("not exported")
}

func (e *exporter) Deliver(a Access, payload []byte) error {
	seg := a.Name
	e.mu.Lock()
	d := e.deliver
	e.mu.Unlock()
	if d != nil {
		if err := d(seg, payload); err != nil {
			return err
		}
	}
	s := seg + ":" + string(payload)
	e.mu.Lock()
	e.notes = append(e.notes, s)
	e.mu.Unlock()
	select {
	case e.notifyCh <- s:
	default:
	}
	return nil
}

// logBuf collects log lines of one node.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuf) waitContains(t *testing.T, what string) {
	t.Helper()
	testutil.Eventually(t, 3*time.Second, func() bool { return strings.Contains(l.String(), what) },
		"the log containing %q:\n%s", what, l)
}

type testNode struct {
	*Node
	exp  *exporter
	logs *logBuf
}

func startNode(t testing.TB, cfg Config) *testNode {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 2 * time.Second
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 5 * time.Second
	}
	lb := &logBuf{}
	exp := newExporter()
	n, err := NewNode(cfg, exp, slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatalf("NewNode %s: %v", cfg.DaemonID, err)
	}
	t.Cleanup(func() {
		n.Close()
		exp.mu.Lock()
		defer exp.mu.Unlock()
		for name, s := range exp.segs {
			if s.Underflowed() {
				t.Errorf("%s: exported segment %q released below zero", cfg.DaemonID, name)
			}
		}
	})
	return &testNode{Node: n, exp: exp, logs: lb}
}

// link tells a about b (where to dial it) and b about a (so that b
// accepts a: a node refuses daemon ids its directory does not list).
func link(t testing.TB, a, b *testNode) {
	t.Helper()
	if err := a.Directory().Update(directory.Peer{ID: b.ID(), Addr: b.Addr()}); err != nil {
		t.Fatal(err)
	}
	if err := b.Directory().Update(directory.Peer{ID: a.ID(), Addr: a.Addr()}); err != nil {
		t.Fatal(err)
	}
}

func mkTask(c xfer.Completer, op xfer.Op, local *xfertest.Segment, loff uint64, r *Remote, toff, ln uint64) *xfer.Task {
	t := &xfer.Task{Req: xfer.Request{Op: op, Local: local.ID(), LocalOffset: loff, Target: r.ID(), TargetOffset: toff, Length: ln},
		Local: local, Target: r}
	t.SetCompleter(c)
	return t
}

// submitWait submits tasks and waits for every one of them.
func submitWait(t testing.TB, n *Node, c *xfertest.Recorder, tasks []*xfer.Task, d time.Duration) []xfertest.End {
	t.Helper()
	k, err := n.Submit(tasks)
	if k != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v; want %d", k, err, len(tasks))
	}
	return c.Next(t, len(tasks), d)
}

func fill(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

var _ = fmt.Sprintf

// cloneRemote copies r with another token.
func cloneRemote(r *Remote, tok []byte) *Remote {
	c := &Remote{node: r.node, peer: r.peer, name: r.name, access: r.access, id: r.id, size: r.size, rights: r.rights, epoch: r.epoch}
	cur := r.cred.Load()
	c.cred.Store(&credential{token: tok, expiry: cur.expiry, got: cur.got})
	return c
}
