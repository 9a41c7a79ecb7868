package tcp

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/crc32c"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

func TestMain(m *testing.M) { testutil.Main(m, testutil.Child(netnsRoleEnv, netnsChild)) }

func TestKeyFileAndConfig(t *testing.T) {
	dir := t.TempDir()
	good := testutil.KeyFile(t, dir, "good", "secret")
	loose := testutil.KeyFile(t, dir, "loose", "secret")
	if err := os.Chmod(loose, 0o640); err != nil {
		t.Fatal(err)
	}
	empty := testutil.KeyFile(t, dir, "empty", "  ")
	cases := []struct {
		name string
		cfg  Config
		want error
	}{
		{"group readable key", Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: loose}, ErrKeyFile},
		{"empty key", Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: empty}, ErrKeyFile},
		{"missing key", Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: filepath.Join(dir, "nope")}, ErrKeyFile},
		{"no key", Config{DaemonID: "a", Listen: "127.0.0.1:0"}, ErrKeyFile},
		{"no id", Config{Listen: "127.0.0.1:0", ClusterKeyFile: good}, ErrConfig},
		{"no listen", Config{DaemonID: "a", ClusterKeyFile: good}, ErrConfig},
		{"tiny slice", Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: good, SliceSize: 10}, ErrConfig},
		{"window below slice", Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: good, MaxInflightBytes: 100}, ErrConfig},
		{"frame below slice", Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: good, SliceSize: 1 << 20, MaxFrame: 4096}, ErrConfig},
	}
	for _, c := range cases {
		_, err := NewNode(c.cfg, newExporter(), nil)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	n, err := NewNode(Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: good}, newExporter(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n.Epoch() == 0 || n.Addr() == "" {
		t.Fatalf("epoch %#x addr %q", n.Epoch(), n.Addr())
	}
	n2, err := NewNode(Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: good}, newExporter(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n2.Epoch() == n.Epoch() {
		t.Fatal("two starts drew the same epoch")
	}
	n.Close()
	n2.Close()
	n.Close() // twice is fine
	if k, err := n.Submit([]*xfer.Task{{}}); k != 0 || !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("Submit after Close = %d, %v", k, err)
	}
}

// pair starts nodes that know each other, each exporting "seg" of size.
func cluster(t *testing.T, ids []string, size int, cfg Config) []*testNode {
	t.Helper()
	key := testutil.KeyFile(t, t.TempDir(), "key", "cluster-secret")
	var nodes []*testNode
	for i, id := range ids {
		c := cfg
		c.DaemonID, c.ClusterKeyFile = id, key
		n := startNode(t, c)
		s := xfertest.NewSegment(xfer.SegmentID(100+i), size)
		fill(rand.New(rand.NewPCG(uint64(i), 9)), s.Bytes())
		n.exp.add("seg", s)
		nodes = append(nodes, n)
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				link(t, a, b)
			}
		}
	}
	return nodes
}

func TestIntegrityTwoAndThreeNodes(t *testing.T) {
	for _, k := range []int{2, 3} {
		t.Run(strings.Repeat("n", k), func(t *testing.T) {
			ids := []string{"alpha", "bravo", "charlie"}[:k]
			const size = 8 << 20
			nodes := cluster(t, ids, size, Config{SliceSize: 64 << 10, ConnsPerPeer: 3})
			rng := rand.New(rand.NewPCG(uint64(k), 1))
			for round := 0; round < 3; round++ {
				for _, a := range nodes {
					for _, b := range nodes {
						if a == b {
							continue
						}
						r, err := a.Open(b.ID(), "seg", RightRead|RightWrite)
						if err != nil {
							t.Fatal(err)
						}
						if r.Kind() != xfer.KindRemote || r.Size() != size {
							t.Fatalf("remote kind %v size %d", r.Kind(), r.Size())
						}
						local := xfertest.NewSegment(1, 4<<20)
						fill(rng, local.Bytes())
						col := xfertest.NewRecorder()
						// WRITE random ranges, then READ them back into another place.
						type rng3 struct{ loff, toff, ln uint64 }
						var ranges []rng3
						var tasks []*xfer.Task
						toff := uint64(0)
						for i := 0; i < 6; i++ {
							ln := 1 + rng.Uint64N(600<<10)
							loff := rng.Uint64N(uint64(len(local.Bytes())) - ln)
							ranges = append(ranges, rng3{loff, toff, ln})
							tasks = append(tasks, mkTask(col, xfer.OpWrite, local, loff, r, toff, ln))
							toff += ln + rng.Uint64N(4096)
						}
						for _, d := range submitWait(t, a.Node, col, tasks, 20*time.Second) {
							if d.Err != nil || d.N != d.Task.Req.Length {
								t.Fatalf("write: n=%d err=%v", d.N, d.Err)
							}
						}
						target := b.exp.segs["seg"]
						for _, x := range ranges {
							if crc(target.Bytes()[x.toff:x.toff+x.ln]) != crc(local.Bytes()[x.loff:x.loff+x.ln]) {
								t.Fatalf("%s→%s: target range %+v differs", a.ID(), b.ID(), x)
							}
						}
						back := xfertest.NewSegment(2, 4<<20)
						tasks = tasks[:0]
						boff := uint64(0)
						for _, x := range ranges {
							tasks = append(tasks, mkTask(col, xfer.OpRead, back, boff, r, x.toff, x.ln))
							boff += x.ln
						}
						for _, d := range submitWait(t, a.Node, col, tasks, 20*time.Second) {
							if d.Err != nil || d.N != d.Task.Req.Length {
								t.Fatalf("read: n=%d err=%v", d.N, d.Err)
							}
						}
						boff = 0
						for _, x := range ranges {
							if crc(back.Bytes()[boff:boff+x.ln]) != crc(local.Bytes()[x.loff:x.loff+x.ln]) {
								t.Fatalf("%s←%s: read-back of %+v differs", a.ID(), b.ID(), x)
							}
							boff += x.ln
						}
						r.Close()
					}
				}
			}
			for _, a := range nodes {
				for _, p := range a.Peers() {
					if !p.Connected || p.BytesOut == 0 || p.BytesIn == 0 || p.Epoch == 0 {
						t.Fatalf("%s sees %+v", a.ID(), p)
					}
				}
				if len(a.Segments()) != 0 {
					t.Fatalf("closed remotes still listed: %+v", a.Segments())
				}
			}
			for _, n := range nodes {
				// The owner drops a request's reference after it answered:
				// the last one may still be on its way back.
				s := n.exp.segs["seg"]
				testutil.Eventually(t, 5*time.Second, func() bool { return s.Refs() == 0 },
					"%s: exported segment refs = %v after the transfers", n.ID(), testutil.Lazy(s.Refs))
			}
		})
	}
}

// TestReadSums: a READ that asks for its crc32c (Task.Sum) gets the
// checksum of the bytes that landed, taken as they came off the socket,
// when one slice carries the whole READ; one cut into slices, or one that
// did not ask, gets none, and the caller takes it itself.
func TestReadSums(t *testing.T) {
	const size, slice = 1 << 20, 64 << 10
	nodes := cluster(t, []string{"alpha", "bravo"}, size, Config{SliceSize: slice, ConnsPerPeer: 2})
	a, b := nodes[0], nodes[1]
	fill(rand.New(rand.NewPCG(7, 7)), b.exp.segs["seg"].Bytes())
	r, err := a.Open(b.ID(), "seg", RightRead)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	local := xfertest.NewSegment(1, size)
	col := xfertest.NewRecorder()
	cases := []struct {
		toff, ln uint64
		ask      bool
		taken    bool
	}{
		{0, 1, true, true},
		{4093, 4096, true, true},
		{slice, slice, true, true}, // exactly one slice
		{3 * slice, slice + 1, true, false},
		{5 * slice, 3 * slice, true, false},
		{9 * slice, 4096, false, false},
	}
	sums := make([]xfer.Sum, len(cases))
	var tasks []*xfer.Task
	loff := uint64(0)
	for i, c := range cases {
		task := mkTask(col, xfer.OpRead, local, loff, r, c.toff, c.ln)
		if c.ask {
			sums[i] = xfer.Sum{CRC: 1, Taken: false}
			task.Sum = &sums[i]
		}
		tasks = append(tasks, task)
		loff += c.ln
	}
	for _, d := range submitWait(t, a.Node, col, tasks, 20*time.Second) {
		if d.Err != nil || d.N != d.Task.Req.Length {
			t.Fatalf("read: n=%d err=%v", d.N, d.Err)
		}
	}
	loff = 0
	for i, c := range cases {
		got := local.Bytes()[loff : loff+c.ln]
		loff += c.ln
		if !bytes.Equal(got, b.exp.segs["seg"].Bytes()[c.toff:c.toff+c.ln]) {
			t.Fatalf("case %d: bytes differ", i)
		}
		switch {
		case sums[i].Taken != c.taken:
			t.Errorf("case %d (%d bytes at %d, asked %v): taken %v, want %v", i, c.ln, c.toff, c.ask, sums[i].Taken, c.taken)
		case c.taken && sums[i].CRC != crc32c.Checksum(got):
			t.Errorf("case %d: crc32c %#x, the bytes' is %#x", i, sums[i].CRC, crc32c.Checksum(got))
		}
	}
}

func TestStripingUsesEveryConnection(t *testing.T) {
	nodes := cluster(t, []string{"a", "b"}, 8<<20, Config{SliceSize: 64 << 10, ConnsPerPeer: 4})
	a, b := nodes[0], nodes[1]
	r, err := a.Open("b", "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 8<<20)
	col := xfertest.NewRecorder()
	for _, d := range submitWait(t, a.Node, col, []*xfer.Task{mkTask(col, xfer.OpWrite, local, 0, r, 0, 8<<20)}, 20*time.Second) {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
	}
	p := b.peer("a", false)
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.inbound) != 4 {
		t.Fatalf("b has %d inbound connections from a, want 4", len(p.inbound))
	}
	for c := range p.inbound {
		if c.dataReqs.Load() == 0 {
			t.Fatalf("connection %v carried no slice of the 8 MiB request", c.g.RemoteAddr())
		}
	}
}

func TestPermissions(t *testing.T) {
	clk := testutil.NewClock(time.Now()) // tokens are issued, checked and renewed by it
	nodes := cluster(t, []string{"a", "b"}, 1<<20, Config{TokenTTL: time.Minute, tokenClock: clk.Now})
	a, b := nodes[0], nodes[1]
	if _, err := a.Open("b", "nope", RightRead); !errors.Is(err, ErrNotFound) {
		t.Fatalf("open of an unexported segment: %v", err)
	}
	if _, err := a.Open("zz", "seg", RightRead); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("open on an unknown peer: %v", err)
	}
	if _, err := a.Open("b", "seg", 0); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("open with no rights: %v", err)
	}
	local := xfertest.NewSegment(1, 1<<20)
	col := xfertest.NewRecorder()
	ro, err := a.Open("b", "seg", RightRead)
	if err != nil {
		t.Fatal(err)
	}
	// The token as issued; ro's own is renewed before it expires.
	stale := cloneRemote(ro, ro.cred.Load().token)
	one := func(tk *xfer.Task) error {
		t.Helper()
		return submitWait(t, a.Node, col, []*xfer.Task{tk}, 5*time.Second)[0].Err
	}
	if err := one(mkTask(col, xfer.OpWrite, local, 0, ro, 0, 100)); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("write with a read-only token: %v", err)
	}
	if err := one(mkTask(col, xfer.OpRead, local, 0, ro, 0, 100)); err != nil {
		t.Fatalf("read with a read token: %v", err)
	}
	if err := one(mkTask(col, xfer.OpRead, local, 0, ro, 1<<20-10, 100)); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("read beyond the segment: %v", err)
	}
	// Owner-side checks: a token whose rights were widened by the holder
	// fails its signature; the owner refuses it.
	tok, _ := decodeToken(ro.cred.Load().token)
	tok.rights = RightRead | RightWrite
	forged := cloneRemote(ro, append(tok.body(nil), tok.mac...))
	forged.rights = RightRead | RightWrite
	if err := one(mkTask(col, xfer.OpWrite, local, 0, forged, 0, 100)); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("write with a forged token: %v", err)
	}
	// A token for another segment name (wrong scope) does not verify either.
	tok2, _ := decodeToken(ro.cred.Load().token)
	tok2.access.Name = "other"
	scoped := cloneRemote(ro, tok2.sign([]byte("not the key")))
	if err := one(mkTask(col, xfer.OpRead, local, 0, scoped, 0, 100)); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("read with a token for another segment: %v", err)
	}
	b.logs.waitContains(t, "request refused: ")
	// Expiry: the token as issued works until its lifetime has passed on
	// the owner's clock, and not after.
	if err := one(mkTask(col, xfer.OpRead, local, 0, stale, 0, 100)); err != nil {
		t.Fatalf("read with the token as issued, within its lifetime: %v", err)
	}
	clk.Advance(time.Minute)
	if err := one(mkTask(col, xfer.OpRead, local, 0, stale, 0, 100)); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("read with an expired token: %v", err)
	}
	// Bad tasks end with typed errors.
	bad := []*xfer.Task{
		mkTask(col, xfer.OpRead, local, 0, ro, 0, 0),
		mkTask(col, 9, local, 0, ro, 0, 10),
		mkTask(col, xfer.OpRead, local, 1<<20, ro, 0, 10),
	}
	notRemote := mkTask(col, xfer.OpRead, local, 0, ro, 0, 10)
	notRemote.Target = local
	bad = append(bad, notRemote)
	for _, d := range submitWait(t, a.Node, col, bad, 5*time.Second) {
		if !errors.Is(d.Err, xfer.ErrInvalid) {
			t.Fatalf("bad task ended with %v", d.Err)
		}
	}
	// The owner drops a read's reference after it sent the answer: wait
	// for the last one.
	seg := b.exp.segs["seg"]
	testutil.Eventually(t, 5*time.Second, func() bool { return seg.Refs() == 0 }, "segment refs %v", testutil.Lazy(seg.Refs))
}

// TestTenantsInOpen: the open request carries the asking client's tenant
// and the export's, the owner's Exporter decides, and the token binds
// them. A client of B reaches B's "seg", one of C the export of A that
// grants C; one of B asking for A's is refused PERMISSION_DENIED, and a
// data request under a token whose grant was withdrawn is refused too.
// An access without tenants is asked and granted as before tenants (the
// name alone, a version 1 token).
func TestTenantsInOpen(t *testing.T) {
	nodes := cluster(t, []string{"a", "b"}, 1<<16, Config{})
	a, b := nodes[0], nodes[1]
	segA, segB := xfertest.NewSegment(201, 4096), xfertest.NewSegment(202, 4096)
	fill(rand.New(rand.NewPCG(1, 1)), segA.Bytes())
	fill(rand.New(rand.NewPCG(2, 2)), segB.Bytes())
	b.exp.addAs("A", "seg", segA, "C")
	b.exp.addAs("B", "seg", segB)
	local := xfertest.NewSegment(1, 4096)
	col := xfertest.NewRecorder()
	read := func(r *Remote) error {
		t.Helper()
		clear(local.Bytes())
		return submitWait(t, a.Node, col, []*xfer.Task{mkTask(col, xfer.OpRead, local, 0, r, 0, 4096)}, 5*time.Second)[0].Err
	}

	rb, err := a.OpenAs("b", Access{Tenant: "B", Name: "seg"}, RightRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := read(rb); err != nil || !bytes.Equal(local.Bytes(), segB.Bytes()) {
		t.Fatalf("B's client reading B's seg: %v (bytes equal %v)", err, bytes.Equal(local.Bytes(), segB.Bytes()))
	}
	if tk, err := decodeToken(rb.Token()); err != nil || rb.Token()[0] != tokenV2 || tk.access != (Access{Tenant: "B", Name: "seg"}) {
		t.Fatalf("B's token: %+v, %v", tk, err)
	}
	rc, err := a.OpenAs("b", Access{Tenant: "C", Owner: "A", Name: "seg"}, RightRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := read(rc); err != nil || !bytes.Equal(local.Bytes(), segA.Bytes()) {
		t.Fatalf("C's client reading A's seg: %v", err)
	}
	if _, err := a.OpenAs("b", Access{Tenant: "B", Owner: "A", Name: "seg"}, RightRead); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("B's client opening A's seg: %v, want a permission error", err)
	}
	b.logs.waitContains(t, "request refused: open")

	rd, err := a.Open("b", "seg", RightRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := read(rd); err != nil || !bytes.Equal(local.Bytes(), b.exp.segs["seg"].Bytes()[:4096]) {
		t.Fatalf("a client without tenants reading the default seg: %v", err)
	}
	if rd.Token()[0] != tokenV1 {
		t.Fatalf("a token without tenants is of version %d, want 1 (daemons before tenants read it)", rd.Token()[0])
	}

	// A's grant to C is withdrawn: C's token no longer reaches the export.
	b.exp.addAs("A", "seg", segA)
	if err := read(rc); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("C's client reading after the grant was withdrawn: %v", err)
	}
	if err := read(rb); err != nil {
		t.Fatalf("B's client after A's grant changed: %v", err)
	}
}

// TestOpenMeta: the open request's metadata, in both forms.
func TestOpenMeta(t *testing.T) {
	for _, a := range []Access{{Name: "kv"}, {Tenant: "B", Name: "kv"}, {Tenant: "B", Owner: "A", Name: "kv"}, {Owner: "A", Name: "kv"}} {
		m := encodeOpen(a)
		if got, err := decodeOpen(m); err != nil || got != a {
			t.Errorf("%+v encoded as %q decodes as %+v, %v", a, m, got, err)
		}
		if (a.Tenant == "" && a.Owner == "") != (m[0] != openAccess) {
			t.Errorf("%+v encoded as %q: the name alone is for an access without tenants", a, m)
		}
	}
	for _, m := range [][]byte{nil, {openAccess}, []byte("/\x02kv\x00\x00"), append([]byte("/\x02kv\x01B\x00"), 0), bytes.Repeat([]byte("x"), maxNameLen+1)} {
		if a, err := decodeOpen(m); !errors.Is(err, ErrFrame) {
			t.Errorf("decodeOpen(%q) = %+v, %v; want ErrFrame", m, a, err)
		}
	}
}

func TestNotifications(t *testing.T) {
	// One connection: the write after the late ACK follows it on the wire,
	// so the ACK has been handled when that write's answer is.
	a, b, r, local, col := notifyPair(t)
	fill(rand.New(rand.NewPCG(5, 5)), local.Bytes())

	// Positive ACK: delivered after the data landed.
	var landed bool
	b.exp.mu.Lock()
	b.exp.deliver = func(seg string, p []byte) error {
		landed = crc(b.exp.segs["seg"].Bytes()[:300<<10]) == crc(local.Bytes()[:300<<10])
		return nil
	}
	b.exp.mu.Unlock()
	tk := mkTask(col, xfer.OpWrite, local, 0, r, 0, 300<<10)
	tk.Notify, tk.Deadline = []byte("kv-ready"), time.Now().Add(2*time.Second)
	if d := submitWait(t, a.Node, col, []*xfer.Task{tk}, 5*time.Second)[0]; d.Err != nil || d.N != 300<<10 {
		t.Fatalf("notified write: n=%d err=%v", d.N, d.Err)
	}
	if got := <-b.exp.notifyCh; got != "seg:kv-ready" || !landed {
		t.Fatalf("delivered %q, data landed first: %v", got, landed)
	}

	// Negative ACK → failed.
	b.exp.mu.Lock()
	b.exp.deliver = func(string, []byte) error { return errors.New("no subscriber") }
	b.exp.mu.Unlock()
	tk = mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096)
	tk.Notify, tk.Deadline = []byte("x"), time.Now().Add(2*time.Second)
	if d := submitWait(t, a.Node, col, []*xfer.Task{tk}, 5*time.Second)[0]; !errors.Is(d.Err, ErrNotifyRejected) {
		t.Fatalf("negative ACK ended with %v", d.Err)
	}

	// No ACK by the deadline → timeout; the late ACK is ignored and the
	// connection keeps serving. The delivery holds the ACK back until the
	// task has timed out.
	delivering, late := make(chan struct{}, 1), make(chan struct{})
	b.exp.mu.Lock()
	b.exp.deliver = func(string, []byte) error { delivering <- struct{}{}; <-late; return nil }
	b.exp.mu.Unlock()
	tk = mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096)
	tk.Notify, tk.Deadline = []byte("slow"), time.Now().Add(100*time.Millisecond)
	d := submitWait(t, a.Node, col, []*xfer.Task{tk}, 5*time.Second)[0]
	if !errors.Is(d.Err, xfer.ErrTimeout) {
		t.Fatalf("missing ACK ended with %v", d.Err)
	}
	select {
	case <-delivering: // the notification reached its owner; only its ACK is missing
	case <-time.After(5 * time.Second):
		t.Fatal("the timed-out notification never reached the owner's delivery")
	}
	b.exp.mu.Lock()
	b.exp.deliver = nil
	b.exp.mu.Unlock()
	close(late) // the ACK goes out now, after its task ended
	tk = mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096)
	if d := submitWait(t, a.Node, col, []*xfer.Task{tk}, 5*time.Second)[0]; d.Err != nil {
		t.Fatalf("write after a late ACK: %v", d.Err)
	}
	if strings.Contains(a.logs.String(), "dropping peer connection") {
		t.Fatalf("a late ACK dropped the connection:\n%s", a.logs.String())
	}

	// Bad notifications end their task, typed.
	big := mkTask(col, xfer.OpWrite, local, 0, r, 0, 10)
	big.Notify, big.Deadline = make([]byte, MaxNotify+1), time.Now().Add(time.Second)
	if d := submitWait(t, a.Node, col, []*xfer.Task{big}, 5*time.Second)[0]; !errors.Is(d.Err, xfer.ErrInvalid) {
		t.Fatalf("oversized notification: %v", d.Err)
	}
	rd := mkTask(col, xfer.OpRead, local, 0, r, 0, 10)
	rd.Notify, rd.Deadline = []byte("x"), time.Now().Add(time.Second)
	if d := submitWait(t, a.Node, col, []*xfer.Task{rd}, 5*time.Second)[0]; !errors.Is(d.Err, xfer.ErrInvalid) {
		t.Fatalf("notification on a read: %v", d.Err)
	}

	// Two identical notified WRITEs in one call each carry their own.
	twin := []*xfer.Task{mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096), mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096)}
	twin[0].Notify, twin[0].Deadline = []byte("first"), time.Now().Add(2*time.Second)
	twin[1].Notify, twin[1].Deadline = []byte("second"), time.Now().Add(2*time.Second)
	for _, d := range submitWait(t, a.Node, col, twin, 5*time.Second) {
		if d.Err != nil {
			t.Fatalf("identical notified write: %v", d.Err)
		}
	}
	b.exp.mu.Lock()
	notes := slices.Clone(b.exp.notes)
	b.exp.mu.Unlock()
	if !slices.Contains(notes, "seg:first") || !slices.Contains(notes, "seg:second") {
		t.Fatalf("identical notified writes delivered %v", notes)
	}
}

func TestHandshakeExchangesBlobs(t *testing.T) {
	kf := testutil.KeyFile(t, t.TempDir(), "k", "k")
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf, Blob: []byte("qpn=17;gid=fe80::1")})
	b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf, Blob: []byte("qpn=99")})
	link(t, a, b)
	if _, ok := a.PeerBlob("b"); ok {
		t.Fatal("blob known before any handshake")
	}
	b.exp.add("seg", xfertest.NewSegment(1, 4096))
	r, err := a.Open("b", "seg", RightRead)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := a.PeerBlob("b"); !ok || string(got) != "qpn=99" {
		t.Fatalf("a sees b's blob %q %v", got, ok)
	}
	if got, ok := b.PeerBlob("a"); !ok || string(got) != "qpn=17;gid=fe80::1" {
		t.Fatalf("b sees a's blob %q %v", got, ok)
	}
	segs := a.Segments()
	if len(segs) != 1 || segs[0].Peer != "b" || segs[0].Name != "seg" || segs[0].Size != 4096 || segs[0].Rights != RightRead ||
		segs[0].Epoch != b.Epoch() || !segs[0].Expires.After(time.Now()) {
		t.Fatalf("segments %+v", segs)
	}
	r.Close()
	if r.Acquire() {
		t.Fatal("Acquire on a closed remote")
	}
}

func TestWrongKeyRefusedAndLoggedOnBothSides(t *testing.T) {
	dir := t.TempDir()
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: testutil.KeyFile(t, dir, "ka", "key-one")})
	b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: testutil.KeyFile(t, dir, "kb", "key-two")})
	link(t, a, b)
	link(t, b, a)
	if _, err := a.Open("b", "seg", RightRead); !errors.Is(err, ErrAuth) {
		t.Fatalf("open across keys: %v", err)
	}
	a.logs.waitContains(t, "authentication failed")
	b.logs.waitContains(t, "peer refused us")
	if _, err := b.Open("a", "seg", RightRead); !errors.Is(err, ErrAuth) {
		t.Fatalf("open across keys (other way): %v", err)
	}
	for _, n := range []*testNode{a, b} {
		for _, p := range n.Peers() {
			if p.Connected {
				t.Fatalf("%s connected to %s across keys", n.ID(), p.ID)
			}
		}
	}
}

func TestStaleEpochRefusedBothWays(t *testing.T) {
	dir := t.TempDir()
	key := testutil.KeyFile(t, dir, "k", "k")
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: key})
	const e1, e2 = 0x1111, 0x2222
	b1 := startNode(t, Config{DaemonID: "b", ClusterKeyFile: key, Epoch: e1})
	addr := b1.Addr()
	link(t, a, b1)
	if _, err := a.Open("b", "x", RightRead); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	b1.Close()
	b2 := startNode(t, Config{DaemonID: "b", ClusterKeyFile: key, Epoch: e2, Listen: addr})
	link(t, a, b2)
	b2.exp.add("x", xfertest.NewSegment(1, 10))
	testutil.Eventually(t, 3*time.Second, func() bool { _, err := a.Open("b", "x", RightRead); return err == nil },
		"a session with the restarted peer")
	if p := a.Peers()[0]; p.Epoch != e2 {
		t.Fatalf("epoch after restart %#x", p.Epoch)
	}
	b2.Close()
	// A peer coming back with the retired epoch is refused, both ways.
	b3 := startNode(t, Config{DaemonID: "b", ClusterKeyFile: key, Epoch: e1, Listen: addr})
	link(t, b3, a)
	testutil.Eventually(t, 3*time.Second, func() bool {
		_, err := a.Open("b", "x", RightRead)
		return errors.Is(err, ErrStaleEpoch)
	}, "the stale epoch refused by the dialer")
	a.logs.waitContains(t, "reason=\"stale epoch\"")
	b3.logs.waitContains(t, "peer refused us")
	if _, err := b3.Open("a", "x", RightRead); !errors.Is(err, ErrRefused) {
		t.Fatalf("stale peer dialing in: %v", err)
	}
	b3.logs.waitContains(t, "reason=\"stale epoch\"")
}

// TestTokenRenewal: a remote segment kept open outlives its owner's token
// lifetime, its token renewed on the same terms before it expires; once the
// owner stops exporting it, renewal fails (logged), the last token runs out
// and requests fail with ErrPermission.
func TestTokenRenewal(t *testing.T) {
	const ttl = time.Minute
	clk := testutil.NewClock(time.Now()) // tokens are issued, checked and renewed by it
	nodes := cluster(t, []string{"a", "b"}, 1<<20, Config{TokenTTL: ttl, tokenClock: clk.Now})
	a, b := nodes[0], nodes[1]
	r, err := a.Open("b", "seg", RightRead)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 1<<20)
	col := xfertest.NewRecorder()
	read := func() error {
		t.Helper()
		return submitWait(t, a.Node, col, []*xfer.Task{mkTask(col, xfer.OpRead, local, 0, r, 0, 4096)}, 5*time.Second)[0].Err
	}
	// Each step moves the clock 0.7 of a lifetime on: into the last third
	// of the token's life, where it is renewed before it expires.
	step := ttl * 7 / 10
	seen := map[string]bool{string(r.cred.Load().token): true}
	for i := 1; i <= 6; i++ {
		old := string(r.cred.Load().token)
		clk.Advance(step)
		testutil.Eventually(t, 10*time.Second, func() bool { return string(r.cred.Load().token) != old },
			"token renewed %v after opening, token lifetime %v", time.Duration(i)*step, ttl)
		if err := read(); err != nil {
			t.Fatalf("read %v after opening, token lifetime %v: %v", time.Duration(i)*step, ttl, err)
		}
		seen[string(r.cred.Load().token)] = true
	}
	if len(seen) != 7 {
		t.Fatalf("%d tokens over four token lifetimes, want 7 (renewed before each expiry)", len(seen))
	}
	tk, err := decodeToken(r.cred.Load().token)
	if err != nil || tk.access.Name != "seg" || tk.rights != RightRead || tk.epoch != r.Epoch() {
		t.Fatalf("renewed token %+v, %v: not on the terms of the open", tk, err)
	}
	if infos := a.Segments(); len(infos) != 1 || time.Until(infos[0].Expires) <= 0 {
		t.Fatalf("segments after renewals: %+v", infos)
	}
	// The owner stops exporting: no renewal, then the token runs out.
	b.exp.mu.Lock()
	delete(b.exp.segs, "seg")
	b.exp.mu.Unlock()
	clk.Advance(step)
	a.logs.waitContains(t, "could not renew a remote segment's token")
	clk.Advance(ttl)
	if err := read(); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("read %v after the owner stopped exporting: %v, want ErrPermission", ttl, err)
	}
}

// unsealedSegment is a memory segment whose owner may shrink it, as a
// client buffer of an unsealable memfd is.
type unsealedSegment struct{ *xfertest.Segment }

func (unsealedSegment) Unsealed() bool { return true }

// TestUnsealedLocalRefused: a transfer whose local memory its owner may
// shrink is refused with ErrUnsealed before a byte goes on the stream
// other requests share, both ways; the same memory sealed moves.
func TestUnsealedLocalRefused(t *testing.T) {
	nodes := cluster(t, []string{"a", "b"}, 1<<20, Config{})
	a := nodes[0]
	col := xfertest.NewRecorder()
	r, err := a.Open("b", "seg", RightRead|RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	sealed := xfertest.NewSegment(1, 1<<20)
	// Each op has its own ranges on both sides: the READ's bytes land on
	// one connection's goroutine and the WRITE's are read on another's,
	// an order the race detector cannot see.
	for i, op := range []xfer.Op{xfer.OpRead, xfer.OpWrite} {
		off := uint64(i) * 8192
		tk := mkTask(col, op, sealed, off, r, off, 4096)
		tk.Local = unsealedSegment{sealed}
		if err := submitWait(t, a.Node, col, []*xfer.Task{tk}, 5*time.Second)[0].Err; !errors.Is(err, xfer.ErrUnsealed) {
			t.Fatalf("%v with an unsealed local segment: %v, want ErrUnsealed", op, err)
		}
		if err := submitWait(t, a.Node, col, []*xfer.Task{mkTask(col, op, sealed, off+4096, r, off+4096, 4096)}, 5*time.Second)[0].Err; err != nil {
			t.Fatalf("%v with the same memory sealed: %v", op, err)
		}
	}
}

// TestExportRightsNowBoundTokens: a token holds only what its export
// grants at the request: an export a client narrowed to reading after a
// peer opened it for writing (unexported, and exported again under its
// name) refuses that peer's writes, and still serves its reads.
func TestExportRightsNowBoundTokens(t *testing.T) {
	nodes := cluster(t, []string{"a", "b"}, 1<<16, Config{})
	a, b := nodes[0], nodes[1]
	r, err := a.Open("b", "seg", RightRead|RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 4096)
	fill(rand.New(rand.NewPCG(3, 3)), local.Bytes())
	col := xfertest.NewRecorder()
	before := bytes.Clone(b.exp.segs["seg"].Bytes()[:4096])
	b.exp.only("seg", RightRead)
	write := mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096)
	if d := submitWait(t, a.Node, col, []*xfer.Task{write}, 5*time.Second)[0]; !errors.Is(d.Err, xfer.ErrPermission) {
		t.Fatalf("a write to an export now read-only: n=%d err=%v, want a permission error", d.N, d.Err)
	}
	if !bytes.Equal(b.exp.segs["seg"].Bytes()[:4096], before) {
		t.Fatal("the write to the read-only export landed")
	}
	read := mkTask(col, xfer.OpRead, local, 0, r, 0, 4096)
	if d := submitWait(t, a.Node, col, []*xfer.Task{read}, 5*time.Second)[0]; d.Err != nil || !bytes.Equal(local.Bytes(), before) {
		t.Fatalf("a read of it: %v", d.Err)
	}
}
