package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// lockedBuffer is a log sink safe for the daemon's goroutines.
type lockedBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// peerDaemon is one daemon of a test cluster.
type peerDaemon struct {
	cfg    Config
	d      *Daemon
	cancel context.CancelFunc
	done   chan error
	log    *lockedBuffer
	once   sync.Once
	err    error
}

// startPeer runs a daemon with id on 127.0.0.1 (listen "" picks a port)
// until stop or the end of the test.
func startPeer(t testing.TB, id, key, listen string, peers ...PeerConfig) *peerDaemon {
	t.Helper()
	return startPeerWith(t, id, key, listen, nil, peers...)
}

// startPeerWith is startPeer with a last say on the config.
func startPeerWith(t testing.TB, id, key, listen string, mut func(*Config), peers ...PeerConfig) *peerDaemon {
	t.Helper()
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.PoolSize = 32 << 20
	cfg.DaemonID = id
	cfg.PeerListen = listen
	if listen == "" {
		cfg.PeerListen = "127.0.0.1:0"
	}
	cfg.ClusterKeyFile = key
	cfg.PeerSliceSize = 64 << 10 // requests above 64 KiB are striped
	cfg.Peers = peers
	if mut != nil {
		mut(&cfg)
	}
	p := &peerDaemon{cfg: cfg, log: &lockedBuffer{}, done: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(p.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	d, err := New(cfg, log, env(nil))
	if err != nil {
		t.Fatalf("daemon %s: %v", id, err)
	}
	p.d = d
	var ctx context.Context
	ctx, p.cancel = context.WithCancel(context.Background())
	go func() { p.done <- d.Run(ctx) }()
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Errorf("daemon %s Run: %v", id, err)
		}
	})
	return p
}

func (p *peerDaemon) stop() error {
	p.once.Do(func() {
		p.cancel()
		p.err = <-p.done
	})
	return p.err
}

func (p *peerDaemon) peer() PeerConfig { return PeerConfig{ID: p.cfg.DaemonID, Addr: p.d.PeerAddr()} }

// dialsIn lists peer id without an address: accepted when it dials in (a
// daemon refuses ids it does not list).
func dialsIn(id string) PeerConfig { return PeerConfig{ID: id} }

func (p *peerDaemon) dial(t testing.TB, name string) *client.Client {
	t.Helper()
	c, err := client.Dial(p.cfg.Socket, client.Options{Name: name, CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startPair runs d1 and d2 on one cluster key (keyText): d1 accepts d2
// dialing in, d2 knows d1's address.
func startPair(t testing.TB, keyText string) (d1, d2 *peerDaemon) {
	t.Helper()
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", keyText)
	d1 = startPeer(t, "d1", key, "", dialsIn("d2"))
	return d1, startPeer(t, "d2", key, "", d1.peer())
}

// newBuffer registers a buffer of size bytes on c.
func newBuffer(t testing.TB, c *client.Client, size uint64) *client.Buffer {
	t.Helper()
	b, err := c.RegisterBuffer(size)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// exportBuffer registers a buffer of size bytes on c and exports the whole
// of it under each of names with rights.
func exportBuffer(t testing.TB, c *client.Client, size uint64, rights uint8, names ...string) *client.Buffer {
	t.Helper()
	b := newBuffer(t, c, size)
	for _, name := range names {
		if n, err := c.ExportSegment(name, b.ID, 0, 0, rights); err != nil || n != size {
			t.Fatalf("ExportSegment %s: %d, %v; want the whole %d bytes", name, n, err, size)
		}
	}
	return b
}

// openRemote opens name from c with rights.
func openRemote(t testing.TB, c *client.Client, name string, rights uint8) client.RemoteSegment {
	t.Helper()
	rs, err := c.OpenRemote(name, rights)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// subscriber is a client of d subscribed to the notifications of name.
func subscriber(t testing.TB, d *peerDaemon, name string) *client.Client {
	t.Helper()
	sub := d.dial(t, "subscriber")
	if err := sub.Subscribe(name); err != nil {
		t.Fatal(err)
	}
	return sub
}

func fill(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

// TestPeerPlaneThreeDaemons runs three daemons in this process: clients of
// d2 and d3 write and read a buffer a client of d1 exported, at random
// sizes and offsets, with crc32c checked end to end; then notifications:
// delivered before the writer completes, refused for a segment nobody
// subscribed to and once the subscriber's queue is full.
func TestPeerPlaneThreeDaemons(t *testing.T) {
	keyDir := t.TempDir()
	key := testutil.KeyFile(t, keyDir, "cluster.key", "tensorcast test cluster key")
	d1 := startPeer(t, "d1", key, "", dialsIn("d2"), dialsIn("d3"))
	d2 := startPeer(t, "d2", key, "", d1.peer())
	d3 := startPeer(t, "d3", key, "", d1.peer(), d2.peer())

	const size = 4 << 20
	a := d1.dial(t, "exporter")
	if h := a.Hello(); h.PeerAddr == "" || h.PeerAddr != d1.d.PeerAddr() || h.DaemonID != "d1" {
		t.Fatalf("hello: %+v, want peer address %s", h, d1.d.PeerAddr())
	}
	abuf := exportBuffer(t, a, size, client.RightRead|client.RightWrite, "kv")
	if _, err := a.ExportSegment("kv", abuf.ID, 0, 4096, client.RightRead); !errors.Is(err, client.ErrAlreadyExists) {
		t.Fatalf("second export of one name: %v, want ALREADY_EXISTS", err)
	}

	var wg sync.WaitGroup
	for w, d := range []*peerDaemon{d2, d3} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := writeReadRandom(d, w, abuf.Mem, size); err != nil {
				t.Errorf("via %s: %v", d.cfg.DaemonID, err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// Listings on both ends.
	b := d2.dial(t, "lister")
	ps, err := b.Peers()
	if err != nil || len(ps) != 1 || ps[0].ID != "d1" || !ps[0].Connected || ps[0].BytesOut == 0 {
		t.Fatalf("d2 peers: %+v, %v", ps, err)
	}
	segs, err := a.Segments()
	if err != nil || len(segs) != 1 || segs[0].Name != "kv" || segs[0].Peer != "" || segs[0].Size != size {
		t.Fatalf("d1 segments: %+v, %v", segs, err)
	}
	rs := openRemote(t, b, "d1/kv", client.RightWrite)
	segs, err = b.Segments()
	if err != nil || len(segs) != 1 || segs[0].Peer != "d1" || segs[0].ID != rs.ID || segs[0].Epoch != rs.Epoch {
		t.Fatalf("d2 segments: %+v, %v (opened %+v)", segs, err, rs)
	}
	if _, err := b.OpenRemote("d1/nosuch", client.RightRead); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("open of an unexported name: %v, want NOT_FOUND", err)
	}
	if _, err := b.OpenRemote("d9/kv", client.RightRead); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("open on an unknown peer: %v, want NOT_FOUND", err)
	}
	// An export grants only what its owner said: a read-only export
	// cannot be opened for writing.
	if _, err := a.ExportSegment("kv-ro", abuf.ID, 0, 4096, client.RightRead); err != nil {
		t.Fatal(err)
	}
	if _, err := b.OpenRemote("d1/kv-ro", client.RightRead|client.RightWrite); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("open of a read-only export for writing: %v, want PERMISSION_DENIED", err)
	}
	ro, err := b.OpenRemote("d1/kv-ro", client.RightRead)
	if err != nil {
		t.Fatalf("open of a read-only export for reading: %v", err)
	}
	if err := b.CloseRemote(ro.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.UnexportSegment("kv-ro"); err != nil {
		t.Fatal(err)
	}

	// Notifications.
	sub := subscriber(t, d1, "kv")
	src := newBuffer(t, b, 1<<20)
	fill(rand.New(rand.NewPCG(7, 7)), src.Mem)
	w := xfer.Request{Op: xfer.OpWrite, Local: src.ID, Target: rs.ID, TargetOffset: 8192, Length: 4096}
	res := make([]error, 1)
	sum, err := b.TransferNotify([]xfer.Request{w}, [][]byte{[]byte("layer-3 ready")}, 10*time.Second, res)
	if err != nil || res[0] != nil || sum.Completed != 1 {
		t.Fatalf("WRITE with a notification: %v, %v, %+v", err, res[0], sum)
	}
	// The writer completed only after the target acknowledged, which it
	// does after queueing: the notification is there without waiting.
	notes, err := sub.PollNotifications(nil, 0, 0)
	if err != nil || len(notes) != 1 || notes[0].Segment != "kv" || string(notes[0].Payload) != "layer-3 ready" {
		t.Fatalf("notifications after the ACK: %+v, %v", notes, err)
	}
	if !bytes.Equal(abuf.Mem[8192:8192+4096], src.Mem[:4096]) {
		t.Fatal("the notified WRITE's bytes did not land")
	}
	// Bad attachments are refused per item, client or daemon side.
	if _, err := b.TransferNotify([]xfer.Request{w}, [][]byte{make([]byte, client.MaxNotify+1)}, time.Second, res); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("oversized notification: %v", err)
	}
	r := w
	r.Op = xfer.OpRead
	if sum, err := b.TransferNotify([]xfer.Request{r}, [][]byte{[]byte("x")}, time.Second, res); err != nil || !errors.Is(res[0], client.ErrInvalidArgument) || sum.Completed != 0 {
		t.Fatalf("notification on a READ: %v, %v, %+v", err, res[0], sum)
	}

	// A segment nobody subscribed to: the writer's task fails.
	if _, err := a.ExportSegment("quiet", abuf.ID, 1<<20, 1<<20, client.RightWrite); err != nil {
		t.Fatal(err)
	}
	qs := openRemote(t, b, "d1/quiet", client.RightWrite)
	wq := xfer.Request{Op: xfer.OpWrite, Local: src.ID, Target: qs.ID, Length: 4096}
	sum, err = b.TransferNotify([]xfer.Request{wq}, [][]byte{[]byte("anyone?")}, 10*time.Second, res)
	if err != nil || res[0] == nil || sum.Failed != 1 {
		t.Fatalf("notification nobody subscribed to: %v, %v, %+v (want the task Failed)", err, res[0], sum)
	}
	// Without a notification the same WRITE completes.
	if sum, err = b.Transfer([]xfer.Request{wq}, 10*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
		t.Fatalf("plain WRITE to the quiet segment: %v, %v, %+v", err, res[0], sum)
	}

	// A full queue: the subscriber does not poll; past its bound the
	// writers' tasks fail and nothing beyond the bound is queued.
	const queue = 1024 // control.Limits.MaxNotifications default
	const n = queue + 40
	reqs := make([]xfer.Request, n)
	pay := make([][]byte, n)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: src.ID, LocalOffset: uint64(i) * 64, Target: rs.ID,
			TargetOffset: uint64(i) * 64, Length: 64}
		pay[i] = []byte(fmt.Sprintf("n%d", i))
	}
	res = make([]error, n)
	sum, err = b.TransferNotify(reqs, pay, 30*time.Second, res)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Completed != queue || sum.Failed != n-queue {
		t.Fatalf("with a queue of %d: %+v, want %d completed and %d failed", queue, sum, queue, n-queue)
	}
	st, err := sub.Stats()
	if err != nil {
		t.Fatal(err)
	}
	queued := -1
	for _, c := range st.Connection {
		if c.Name == "notifications_queued" {
			queued = int(c.Value)
		}
	}
	if queued != queue {
		t.Fatalf("subscriber's stats say %d queued, want %d", queued, queue)
	}
	got := 0
	for got < queue {
		notes, err = sub.PollNotifications(notes[:0], 0, time.Second)
		if err != nil || len(notes) == 0 {
			t.Fatalf("polled %d of %d: %v", got, queue, err)
		}
		got += len(notes)
	}
	if notes, err = sub.PollNotifications(notes[:0], 0, 0); err != nil || len(notes) != 0 || got != queue {
		t.Fatalf("queued beyond the bound: %d then %d more (%v)", got, len(notes), err)
	}

	// Pool blocks can be exported too, and are not freed while exported.
	offs, err := a.AllocBlocks(nil, 2, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := a.Pool()
	lo := min(offs[0], offs[1])
	span := uint64(64 << 10)
	if offs[0]+span == offs[1] || offs[1]+span == offs[0] {
		span *= 2
	}
	if _, err := a.ExportSegment("blocks", pool.Segment, lo, span, client.RightRead); err != nil {
		t.Fatal(err)
	}
	fr := make([]error, 1)
	if err := a.FreeBlocks([]uint64{lo}, fr); err != nil || !errors.Is(fr[0], client.ErrFailedPrecondition) {
		t.Fatalf("free of an exported block: %v, %v", err, fr[0])
	}
	if _, err := a.ExportSegment("stolen", pool.Segment, lo, span+(1<<20), client.RightRead); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("export of pool bytes not held: %v", err)
	}
	if err := a.UnexportSegment("blocks"); err != nil {
		t.Fatal(err)
	}
	if err := a.FreeBlocks([]uint64{lo}, fr); err != nil || fr[0] != nil {
		t.Fatalf("free after unexport: %v, %v", err, fr[0])
	}

	// Closing the exporter's connection unexports its segments.
	a.Close()
	res = make([]error, 1)
	testutil.Eventually(t, 5*time.Second, func() bool {
		sum, err = b.Transfer([]xfer.Request{w}, 5*time.Second, res)
		return err == nil && sum.Failed == 1
	}, "a WRITE to a closed exporter's segment failing; last: %v, %v, %+v",
		testutil.Lazy(func() error { return err }), testutil.Lazy(func() error { return res[0] }), testutil.Lazy(func() client.Summary { return sum }))
}

// writeReadRandom opens d1/kv from a client of d and moves random ranges
// both ways, checking crc32c against the exporter's memory.
func writeReadRandom(d *peerDaemon, seed int, exported []byte, size uint64) error {
	c, err := client.Dial(d.cfg.Socket, client.Options{Name: "writer", CallTimeout: 30 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	rs, err := c.OpenRemote("d1/kv", client.RightRead|client.RightWrite)
	if err != nil {
		return err
	}
	if rs.Size != size {
		return fmt.Errorf("remote size %d, want %d", rs.Size, size)
	}
	const local = 1 << 20
	buf, err := c.RegisterBuffer(local)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 99))
	res := make([]error, 1)
	// Each writer owns one half of the segment so they never overlap.
	half := size / 2
	base := uint64(seed) * half
	for i := 0; i < 24; i++ {
		n := 1 + rng.Uint64N(local)
		if i%4 == 0 {
			n = 1 + rng.Uint64N(100)
		}
		loff := rng.Uint64N(local - n + 1)
		toff := base + rng.Uint64N(half-n+1)
		fill(rng, buf.Mem[loff:loff+n])
		want := crc32.Checksum(buf.Mem[loff:loff+n], castagnoli)
		wr := xfer.Request{Op: xfer.OpWrite, Local: buf.ID, LocalOffset: loff, Target: rs.ID, TargetOffset: toff, Length: n}
		if sum, err := c.Transfer([]xfer.Request{wr}, 20*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
			return fmt.Errorf("WRITE %d bytes at %d: %v, %v, %+v", n, toff, err, res[0], sum)
		}
		if got := crc32.Checksum(exported[toff:toff+n], castagnoli); got != want {
			return fmt.Errorf("WRITE %d bytes at %d: crc32c %#x landed, %#x sent", n, toff, got, want)
		}
		loff2 := rng.Uint64N(local - n + 1)
		clear(buf.Mem[loff2 : loff2+n])
		rd := xfer.Request{Op: xfer.OpRead, Local: buf.ID, LocalOffset: loff2, Target: rs.ID, TargetOffset: toff, Length: n}
		if sum, err := c.Transfer([]xfer.Request{rd}, 20*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
			return fmt.Errorf("READ %d bytes at %d: %v, %v, %+v", n, toff, err, res[0], sum)
		}
		if got := crc32.Checksum(buf.Mem[loff2:loff2+n], castagnoli); got != want {
			return fmt.Errorf("READ %d bytes at %d: crc32c %#x read, %#x written", n, toff, got, want)
		}
	}
	return c.CloseRemote(rs.ID)
}

// TestPeerStoppedAndRestarted stops the exporting daemon while a client of
// the other streams WRITEs to it: its tasks end Failed within the deadline
// and its batch frees. After a restart on the same address (a new epoch)
// the survivor reconnects: a fresh OpenRemote works, the old id fails.
func TestPeerStoppedAndRestarted(t *testing.T) {
	d1, d2 := startPair(t, "restart cluster key")
	addr := d1.d.PeerAddr()

	const size = 8 << 20
	exportBuffer(t, d1.dial(t, "exporter"), size, client.RightRead|client.RightWrite, "kv")
	b := d2.dial(t, "writer")
	rs := openRemote(t, b, "d1/kv", client.RightRead|client.RightWrite)
	src := newBuffer(t, b, size)
	fill(rand.New(rand.NewPCG(3, 4)), src.Mem)

	// Stream batches of 8 × 1 MiB until one fails; stop d1 meanwhile.
	type outcome struct {
		sum client.Summary
		err error
		at  time.Time
	}
	out := make(chan outcome, 1)
	streaming := make(chan struct{}) // closed once the first batch is submitted
	go func() {
		reqs := make([]xfer.Request, 8)
		for i := range reqs {
			reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: src.ID, LocalOffset: uint64(i) << 20, Target: rs.ID,
				TargetOffset: uint64(i) << 20, Length: 1 << 20}
		}
		res := make([]error, len(reqs))
		for {
			batch, err := b.AllocBatch(len(reqs))
			if err != nil {
				out <- outcome{err: err}
				return
			}
			if err := b.Submit(batch, reqs, res); err != nil {
				out <- outcome{err: err}
				return
			}
			select {
			case <-streaming:
			default:
				close(streaming)
			}
			sum, err := b.Wait(batch, 20*time.Second)
			if err != nil {
				out <- outcome{err: err}
				return
			}
			if sum.Waiting+sum.Pending != 0 {
				out <- outcome{sum: sum, err: fmt.Errorf("batch still live after its wait: %+v", sum)}
				return
			}
			if err := b.FreeBatch(batch); err != nil {
				out <- outcome{sum: sum, err: fmt.Errorf("FreeBatch of an ended batch: %w", err)}
				return
			}
			if sum.Failed > 0 {
				out <- outcome{sum: sum, at: time.Now()}
				return
			}
		}
	}()
	select {
	case <-streaming:
	case o := <-out:
		t.Fatalf("the stream ended before d1 was stopped: %+v, %v", o.sum, o.err)
	}
	stopped := time.Now()
	if err := d1.stop(); err != nil {
		t.Fatalf("stopping d1: %v", err)
	}
	select {
	case o := <-out:
		if o.err != nil {
			t.Fatal(o.err)
		}
		if o.sum.Failed == 0 || o.sum.Completed+o.sum.Failed != 8 {
			t.Fatalf("batch across the stop: %+v", o.sum)
		}
		t.Logf("batch across the stop: %+v, ended %v after the stop", o.sum, o.at.Sub(stopped).Round(time.Millisecond))
	case <-time.After(40 * time.Second):
		t.Fatal("tasks to a stopped peer did not end")
	}
	ps, err := b.Peers()
	if err != nil || len(ps) != 1 || ps[0].Connected {
		t.Fatalf("d2 peers after d1 stopped: %+v, %v", ps, err)
	}

	// Restart d1 on the same address: a new epoch.
	d1b := startPeer(t, "d1", d1.cfg.ClusterKeyFile, addr, dialsIn("d2"))
	abuf2 := exportBuffer(t, d1b.dial(t, "exporter-2"), size, client.RightRead|client.RightWrite, "kv")
	res := make([]error, 1)
	w := xfer.Request{Op: xfer.OpWrite, Local: src.ID, Target: rs.ID, TargetOffset: 4096, Length: 128 << 10}
	if sum, err := b.Transfer([]xfer.Request{w}, 10*time.Second, res); err != nil || res[0] == nil || sum.Completed != 0 {
		t.Fatalf("WRITE with the old epoch's segment: %v, %v, %+v (want it Failed)", err, res[0], sum)
	}
	rs2, err := b.OpenRemote("d1/kv", client.RightRead|client.RightWrite)
	if err != nil {
		t.Fatalf("OpenRemote after the restart: %v", err)
	}
	if rs2.Epoch == rs.Epoch || rs2.ID == rs.ID {
		t.Fatalf("reopened segment %+v looks like the old one %+v", rs2, rs)
	}
	w.Target = rs2.ID
	if sum, err := b.Transfer([]xfer.Request{w}, 10*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
		t.Fatalf("WRITE after reopening: %v, %v, %+v", err, res[0], sum)
	}
	if crc32.Checksum(abuf2.Mem[4096:4096+128<<10], castagnoli) != crc32.Checksum(src.Mem[:128<<10], castagnoli) {
		t.Fatal("bytes written after the restart differ")
	}
	w.Target = rs.ID
	if sum, err := b.Transfer([]xfer.Request{w}, 10*time.Second, res); err != nil || res[0] == nil || sum.Completed != 0 {
		t.Fatalf("old segment id after the reopen: %v, %v, %+v (want it Failed)", err, res[0], sum)
	}
	ps, err = b.Peers()
	if err != nil || len(ps) != 1 || !ps[0].Connected || ps[0].Epoch != rs2.Epoch {
		t.Fatalf("d2 peers after the restart: %+v, %v (epoch %#x)", ps, err, rs2.Epoch)
	}
}

// TestPeerWrongClusterKey checks that a daemon with another cluster key is
// refused, and that the refusal is logged by the daemon it tried.
func TestPeerWrongClusterKey(t *testing.T) {
	dir := t.TempDir()
	d1 := startPeer(t, "d1", testutil.KeyFile(t, dir, "right.key", "the right key"), "", dialsIn("d2"))
	d2 := startPeer(t, "d2", testutil.KeyFile(t, dir, "wrong.key", "a wrong key"), "", d1.peer())
	exportBuffer(t, d1.dial(t, "exporter"), 1<<20, client.RightRead, "kv")
	b := d2.dial(t, "intruder")
	if _, err := b.OpenRemote("d1/kv", client.RightRead); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("open with a wrong cluster key: %v, want UNAVAILABLE", err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return strings.Contains(d1.log.String(), "authentication failed") },
		"d1 logging the refused handshake:\n%s", d1.log)

	// A key file that others may read is refused at start-up, naming it.
	loose := testutil.KeyFile(t, dir, "loose.key", "the right key")
	if err := os.Chmod(loose, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t.TempDir())
	cfg.DaemonID, cfg.PeerListen, cfg.ClusterKeyFile = "d3", "127.0.0.1:0", loose
	if _, err := New(cfg, discardLogger(), env(nil)); err == nil || !strings.Contains(err.Error(), "cluster_key_file") {
		t.Fatalf("New with a group/other-readable key: %v", err)
	}
}

// TestNotificationsAreArguments: a notification is an argument of its
// WRITE, not a side table matched on the request. Two identical notified
// WRITEs in one call both deliver their own notification (through Transfer
// and through the batch calls); a notified WRITE to a local target fails
// at its own position (UNAVAILABLE: the local transport carries none)
// while its neighbours complete.
func TestNotificationsAreArguments(t *testing.T) {
	d1, d2 := startPair(t, "notify cluster key")
	abuf := exportBuffer(t, d1.dial(t, "exporter"), 1<<20, client.RightWrite, "kv")
	sub := subscriber(t, d1, "kv")
	b := d2.dial(t, "writer")
	rs := openRemote(t, b, "d1/kv", client.RightWrite)
	src := newBuffer(t, b, 1<<20)
	fill(rand.New(rand.NewPCG(1, 9)), src.Mem)
	w := xfer.Request{Op: xfer.OpWrite, Local: src.ID, Target: rs.ID, TargetOffset: 4096, Length: 8192}
	local := xfer.Request{Op: xfer.OpWrite, Local: src.ID, Target: src.ID, TargetOffset: 512 << 10, Length: 4096}
	poll := func(want ...string) {
		t.Helper()
		var got []string
		testutil.Eventually(t, 5*time.Second, func() bool {
			notes, err := sub.PollNotifications(nil, 0, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range notes {
				got = append(got, string(n.Payload))
			}
			return len(got) >= len(want)
		}, "%d notifications delivered; got %q", len(want), testutil.Lazy(func() []string { return got }))
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("delivered %q, want %q", got, want)
		}
	}

	res := make([]error, 4)
	sum, err := b.TransferNotify([]xfer.Request{w, w, local, w}, [][]byte{[]byte("one"), []byte("two"), []byte("three"), nil},
		10*time.Second, res)
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != nil || res[1] != nil || res[3] != nil || !errors.Is(res[2], client.ErrUnavailable) || sum.Completed != 3 || sum.Failed != 1 {
		t.Fatalf("Transfer: %v, %+v; want the twins and the plain WRITE completed, the local notified one UNAVAILABLE", res, sum)
	}
	poll("one", "two")
	if !bytes.Equal(abuf.Mem[4096:4096+8192], src.Mem[:8192]) {
		t.Fatal("the notified WRITEs' bytes did not land")
	}

	// The batch calls: accepted at submit, ended by status.
	batch, err := b.AllocBatch(3)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SubmitNotify(batch, []xfer.Request{w, local, w}, [][]byte{[]byte("four"), []byte("five"), []byte("four")}, res[:3]); err != nil {
		t.Fatal(err)
	}
	for i, r := range res[:3] {
		if r != nil {
			t.Fatalf("submit item %d refused: %v", i, r)
		}
	}
	if sum, err := b.Wait(batch, 10*time.Second); err != nil || sum.Completed != 2 || sum.Failed != 1 {
		t.Fatalf("Wait: %+v, %v", sum, err)
	}
	if st, err := b.TaskStatus(batch, 1); err != nil || st.State != xfer.StateFailed || !errors.Is(st.Err, client.ErrUnavailable) {
		t.Fatalf("notified WRITE to a local target: %+v, %v", st, err)
	}
	if err := b.FreeBatch(batch); err != nil {
		t.Fatal(err)
	}
	poll("four", "four")
}

// TestUnlistedPeerRefused: a daemon with the right cluster key under an id
// the other does not list is refused (the client's open fails
// UNAVAILABLE) and the refusal is logged by the daemon that refused it.
func TestUnlistedPeerRefused(t *testing.T) {
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "listed peers only")
	d1 := startPeer(t, "d1", key, "") // lists nobody
	exportBuffer(t, d1.dial(t, "exporter"), 1<<20, client.RightRead, "kv")
	d2 := startPeer(t, "d2", key, "", d1.peer())
	b := d2.dial(t, "stranger")
	if _, err := b.OpenRemote("d1/kv", client.RightRead); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("open from a daemon d1 does not list: %v, want UNAVAILABLE", err)
	}
	if logs := d1.log.String(); !strings.Contains(logs, `reason="daemon id not among this daemon's peers"`) || !strings.Contains(logs, "claimed=d2") {
		t.Fatalf("d1 did not log the refusal:\n%s", logs)
	}
	if ps, err := d1.dial(t, "lister").Peers(); err != nil || len(ps) != 0 {
		t.Fatalf("d1's peers after refusing d2: %+v, %v", ps, err)
	}
}

// TestNotifiedWriteThroughQueue: a WRITE submitted on a queue with a
// notification completes only after the owner acknowledged it: when its
// CQE is reaped, the subscriber already has the notification (PollNotifications
// answers at once), and the bytes have landed. Without a subscriber the
// owner refuses it and the CQE says so.
func TestNotifiedWriteThroughQueue(t *testing.T) {
	d1, d2 := startPair(t, "queue notify cluster key")
	abuf := exportBuffer(t, d1.dial(t, "exporter"), 1<<20, client.RightWrite, "kv", "quiet")
	sub := subscriber(t, d1, "kv")
	b := d2.dial(t, "writer")
	rs := openRemote(t, b, "d1/kv", client.RightWrite)
	quiet := openRemote(t, b, "d1/quiet", client.RightWrite)
	src := newBuffer(t, b, 1<<20)
	fill(rand.New(rand.NewPCG(3, 3)), src.Mem)
	q, err := b.OpenQueue(8)
	if err != nil {
		t.Fatal(err)
	}
	cqes := make([]client.Completion, 4)
	for i, note := range []string{"layer 0 ready", "layer 1 ready"} {
		off := uint64(i) * 8192
		w := xfer.Request{Op: xfer.OpWrite, Local: src.ID, LocalOffset: off, Target: rs.ID, TargetOffset: 64<<10 + off, Length: 8192}
		if n, err := q.SubmitNotify([]xfer.Request{w}, [][]byte{[]byte(note)}, []uint64{uint64(i)}); n != 1 || err != nil {
			t.Fatalf("submit %d: %d %v", i, n, err)
		}
		if n, err := q.Reap(cqes, 1, 10*time.Second); n != 1 || err != nil || cqes[0].Err() != nil || cqes[0].N != 8192 {
			t.Fatalf("notified WRITE %d: %d %v %+v", i, n, err, cqes[0])
		}
		// The ACK came from the owner after it delivered: nothing to wait for.
		notes, err := sub.PollNotifications(nil, 0, 0)
		if err != nil || len(notes) != 1 || string(notes[0].Payload) != note {
			t.Fatalf("after notified WRITE %d's completion the subscriber has %+v (%v), want %q at once", i, notes, err, note)
		}
		if !bytes.Equal(abuf.Mem[64<<10+off:64<<10+off+8192], src.Mem[off:off+8192]) {
			t.Fatalf("notified WRITE %d's bytes did not land before its completion", i)
		}
	}
	// Nobody subscribed to "quiet": the owner refuses the notification and
	// the CQE fails (fail closed).
	w := xfer.Request{Op: xfer.OpWrite, Local: src.ID, Target: quiet.ID, Length: 4096}
	q.SubmitNotify([]xfer.Request{w}, [][]byte{[]byte("nobody listens")}, []uint64{9})
	if n, err := q.Reap(cqes, 1, 10*time.Second); n != 1 || err != nil || cqes[0].Err() == nil || cqes[0].State != xfer.StateFailed {
		t.Fatalf("notified WRITE nobody subscribed to: %d %v %+v, want a failure", n, err, cqes[0])
	}
}
