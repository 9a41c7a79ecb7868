package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// rdmaPair runs an exporting daemon d1 and a writing daemon d2 with rdma
// set to mode, and returns them with the exporter's and the writer's
// clients: the exporter has exported a pool block (4 MiB, the largest) as
// "kv"; the writer holds two pool blocks.
type rdmaPair struct {
	d1, d2       *peerDaemon
	exp, wr      *client.Client
	expOff       uint64 // the export's offset in d1's pool
	rs           client.RemoteSegment
	pool         xfer.SegmentID // d2's pool
	src, dst     uint64         // d2 pool blocks
	block        uint64
	expMem, wMem []byte
	key          string
	mut          func(*Config)
}

func startRDMAPair(t *testing.T, mode string) *rdmaPair {
	t.Helper()
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast rdma test key")
	mut := func(c *Config) {
		c.PoolSize = 64 << 20
		c.RDMA = mode
		c.RDMADevice = os.Getenv("RXE_DEV")
	}
	p := &rdmaPair{block: 4 << 20, key: key, mut: mut}
	p.d1 = startPeerWith(t, "d1", key, "", mut, dialsIn("d2"))
	p.d2 = startPeerWith(t, "d2", key, "", mut, p.d1.peer())
	p.exp = p.d1.dial(t, "exporter")
	pi, ok := p.exp.Pool()
	if !ok {
		t.Fatal("exporter has no pool mapping")
	}
	offs, err := p.exp.AllocBlocks(nil, 1, p.block)
	if err != nil {
		t.Fatal(err)
	}
	p.expOff, p.expMem = offs[0], p.exp.PoolBytes()
	if _, err := p.exp.ExportSegment("kv", pi.Segment, p.expOff, p.block, client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	p.wr = p.d2.dial(t, "writer")
	wi, ok := p.wr.Pool()
	if !ok {
		t.Fatal("writer has no pool mapping")
	}
	p.pool, p.wMem = wi.Segment, p.wr.PoolBytes()
	offs, err = p.wr.AllocBlocks(nil, 2, p.block)
	if err != nil {
		t.Fatal(err)
	}
	p.src, p.dst = offs[0], offs[1]
	if p.rs, err = p.wr.OpenRemote("d1/kv", client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	return p
}

// roundTrip writes n bytes from the writer's pool into the export at toff,
// reads them back into another pool block and checks crc32c on both ends.
func (p *rdmaPair) roundTrip(rng *rand.Rand, n, toff uint64) error {
	src := p.wMem[p.src : p.src+n]
	fill(rng, src)
	want := crc32.Checksum(src, castagnoli)
	res := make([]error, 1)
	wr := xfer.Request{Op: xfer.OpWrite, Local: p.pool, LocalOffset: p.src, Target: p.rs.ID, TargetOffset: toff, Length: n}
	if sum, err := p.wr.Transfer([]xfer.Request{wr}, 30*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
		return fmt.Errorf("WRITE %d bytes: %v, %v, %+v", n, err, res[0], sum)
	}
	at := p.expOff + toff
	if got := crc32.Checksum(p.expMem[at:at+n], castagnoli); got != want {
		return fmt.Errorf("WRITE %d bytes: crc32c %08x landed, %08x sent", n, got, want)
	}
	dst := p.wMem[p.dst : p.dst+n]
	clear(dst)
	rd := xfer.Request{Op: xfer.OpRead, Local: p.pool, LocalOffset: p.dst, Target: p.rs.ID, TargetOffset: toff, Length: n}
	if sum, err := p.wr.Transfer([]xfer.Request{rd}, 30*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
		return fmt.Errorf("READ %d bytes: %v, %v, %+v", n, err, res[0], sum)
	}
	if got := crc32.Checksum(dst, castagnoli); got != want {
		return fmt.Errorf("READ %d bytes: crc32c %08x read, %08x written", n, got, want)
	}
	return nil
}

// untilRDMA repeats 4 KiB round trips until one moves no byte over tcp:
// the link is up and the segment resolved.
func (p *rdmaPair) untilRDMA(t *testing.T, rng *rand.Rand) time.Duration {
	t.Helper()
	start := time.Now()
	testutil.Eventually(t, 20*time.Second, func() bool {
		before := tcpBytes(p.d2)
		if err := p.roundTrip(rng, 4096, 0); err != nil {
			t.Fatal(err)
		}
		return tcpBytes(p.d2) == before
	}, "requests to d1 off tcp:\n%s", p.d2.log)
	return time.Since(start)
}

// untilNoTCP repeats req from the writer until one runs without payload on
// tcp (the link is up and the target resolved behind the first ones).
func (p *rdmaPair) untilNoTCP(t *testing.T, req xfer.Request) {
	t.Helper()
	res := make([]error, 1)
	testutil.Eventually(t, 20*time.Second, func() bool {
		before := tcpBytes(p.d2)
		if sum, err := p.wr.Transfer([]xfer.Request{req}, 10*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
			t.Fatalf("%v of %d bytes: %v, %v, %+v", req.Op, req.Length, err, res[0], sum)
		}
		return tcpBytes(p.d2)-before < req.Length
	}, "requests to segment %d off tcp:\n%s", req.Target, p.d2.log)
}

// rdmaCounter is the value of d's RDMA counter name (tcctl stats).
func rdmaCounter(t testing.TB, d *peerDaemon, name string) uint64 {
	t.Helper()
	for _, c := range d.d.peers.Counters(nil) {
		if c.Name == name {
			return c.Value
		}
	}
	t.Fatalf("%s has no counter %s", d.cfg.DaemonID, name)
	return 0
}

// tcpBytes is what d2's tcp node moved to and from its peers.
func tcpBytes(d *peerDaemon) uint64 {
	var n uint64
	for _, s := range d.d.peers.Node().Peers() {
		n += s.BytesIn + s.BytesOut
	}
	return n
}

// rdmaSizes go up to the pool's largest block; the rdma package's VM test
// moves 16 MiB between pools set up the same way.
var rdmaSizes = []uint64{4 << 10, 1 << 20, 4 << 20}

// TestRDMAUnavailableUsesTCP is the host without RDMA (no libibverbs, no
// device, or a build without cgo): one log line per daemon, and remote
// requests move over tcp.
func TestRDMAUnavailableUsesTCP(t *testing.T) {
	if os.Getenv("RXE_DEV") != "" {
		t.Skip("RXE_DEV is set: this host has RDMA (TestVerbsDaemonsOverRDMA covers it)")
	}
	p := startRDMAPair(t, "auto")
	rng := rand.New(rand.NewPCG(1, 1))
	for _, n := range rdmaSizes {
		before := tcpBytes(p.d2)
		if err := p.roundTrip(rng, n, (p.block-n)/2); err != nil {
			t.Fatal(err)
		}
		if moved := tcpBytes(p.d2) - before; moved < 2*n {
			t.Fatalf("%d bytes each way moved %d bytes over tcp", n, moved)
		}
	}
	for _, d := range []*peerDaemon{p.d1, p.d2} {
		if c := strings.Count(d.log.String(), "rdma unavailable: peers use tcp"); c != 1 {
			t.Fatalf("%s logged the fallback %d times:\n%s", d.cfg.DaemonID, c, d.log.String())
		}
		if st := d.d.peers.RDMAInfo().State; st != wire.RDMAUnavailable {
			t.Fatalf("%s reports rdma %s without a device, want unavailable", d.cfg.DaemonID, st)
		}
	}
}

// TestRDMAConfig: rdma = off says so; on fails start-up without a device
// (naming the key); bad values are refused.
func TestRDMAConfig(t *testing.T) {
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "k")
	off := startPeerWith(t, "d1", key, "", func(c *Config) { c.RDMA = "off" })
	if !strings.Contains(off.log.String(), "rdma off (rdma = off): peers use tcp") || off.d.peers.RDMAInfo().State != wire.RDMAOff {
		t.Fatalf("rdma = off:\n%s", off.log.String())
	}
	if os.Getenv("RXE_DEV") == "" {
		cfg := testConfig(t.TempDir())
		cfg.PeerListen, cfg.ClusterKeyFile, cfg.RDMA = "127.0.0.1:0", key, "on"
		_, err := New(cfg, slog.New(slog.DiscardHandler), env(nil))
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "rdma = on") {
			t.Fatalf("rdma = on without a device: %v", err)
		}
	}
	for _, c := range []struct{ key, val string }{{"rdma", "maybe"}, {"rdma_device", "a/b"}, {"rdma", "on"}} {
		cfg := testConfig(t.TempDir())
		switch c.key {
		case "rdma":
			cfg.RDMA = c.val
		case "rdma_device":
			cfg.RDMADevice = c.val
		}
		err := cfg.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.key) {
			t.Fatalf("%s = %q: %v", c.key, c.val, err)
		}
	}
}

// TestRDMAKeys: the rdma keys come from the file, the environment and
// flags, in that order of precedence.
func TestRDMAKeys(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tc.toml")
	writeFile(t, file, `
peer_listen = "127.0.0.1:7400"
cluster_key_file = "/etc/tensorcast/cluster.key"
rdma = "on"
rdma_device = "mlx5_0"
rdma_gid = "3"
`)
	c, err := Load([]string{"--config", file}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.RDMA != "on" || c.RDMADevice != "mlx5_0" || c.RDMAGID != "3" {
		t.Fatalf("from the file: rdma %q, device %q, gid %q", c.RDMA, c.RDMADevice, c.RDMAGID)
	}
	c, err = Load([]string{"--config", file, "--rdma-gid", "::ffff:10.0.2.15"},
		env(map[string]string{"TENSORCAST_RDMA": "off", "TENSORCAST_RDMA_DEVICE": "rxe0", "TENSORCAST_RDMA_GID": "1"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.RDMA != "off" || c.RDMADevice != "rxe0" || c.RDMAGID != "::ffff:10.0.2.15" {
		t.Fatalf("env and flag over the file: rdma %q, device %q, gid %q", c.RDMA, c.RDMADevice, c.RDMAGID)
	}
	if d := Defaults(); d.RDMA != "auto" || d.RDMADevice != "" || d.RDMAGID != "" {
		t.Fatalf("defaults: %+v", d)
	}
}

// TestVerbsDaemonsOverRDMA: with an RDMA device (make test-rdma runs it
// in the Soft-RoCE VM), two daemons set RDMA up over their peer channel
// and a client's pool-to-remote requests move by RDMA READ and WRITE,
// crc32c checked, with no payload on tcp.
func TestVerbsDaemonsOverRDMA(t *testing.T) {
	testutil.Require(t, testutil.RDMA)
	p := startRDMAPair(t, "on")
	for _, d := range []*peerDaemon{p.d1, p.d2} {
		if !strings.Contains(d.log.String(), "pool registered for rdma") {
			t.Fatalf("%s did not register its pool:\n%s", d.cfg.DaemonID, d.log.String())
		}
	}
	rng := rand.New(rand.NewPCG(2, 2))
	// The first request goes over tcp and has the link set up behind it.
	testutil.Eventually(t, 20*time.Second, func() bool {
		if strings.Contains(p.d2.log.String(), "peer requests from the pool use rdma") {
			return true
		}
		if err := p.roundTrip(rng, 4096, 0); err != nil {
			t.Fatal(err)
		}
		return false
	}, "the rdma link coming up:\n%s", p.d2.log)
	for _, n := range rdmaSizes {
		before := tcpBytes(p.d2)
		start := time.Now()
		if err := p.roundTrip(rng, n, (p.block-n)/3); err != nil {
			t.Fatal(err)
		}
		if moved := tcpBytes(p.d2) - before; moved != 0 {
			t.Fatalf("%d bytes each way moved %d bytes over tcp", n, moved)
		}
		t.Logf("%d KiB write+read over rdma in %v", n>>10, time.Since(start))
	}
	// tcctl stats carries the peer plane's RDMA counters.
	st, err := p.wr.Stats()
	if err != nil {
		t.Fatal(err)
	}
	stat := map[string]uint64{}
	for _, c := range st.Transports {
		stat[c.Name] = c.Value
	}
	if stat["rdma.links"] != 1 || stat["rdma.tasks"] < uint64(2*len(rdmaSizes)) || stat["rdma.bytes"] < 2*(4<<20) {
		t.Fatalf("d2's stats after %d round trips by rdma: %+v", len(rdmaSizes), st.Transports)
	}
	// The metrics say the link to d1 is rdma.
	if exp := scrapeMetrics(t, p.d2.d.MetricsAddr()); sample(t, exp, `tensorcast_peer_link_state{peer="d1",state="rdma"}`) != 1 {
		t.Fatalf("d2's link to d1 is not rdma in its scrape:\n%s", exp)
	}
	// A notified WRITE moves its bytes by RDMA; the notification follows on
	// the peer channel and the task completes on the owner's answer.
	sub := p.d1.dial(t, "subscriber")
	if err := sub.Subscribe("kv"); err != nil {
		t.Fatal(err)
	}
	res := make([]error, 1)
	fill(rng, p.wMem[p.src:p.src+1<<20])
	w := xfer.Request{Op: xfer.OpWrite, Local: p.pool, LocalOffset: p.src, Target: p.rs.ID, Length: 1 << 20}
	before := tcpBytes(p.d2)
	if sum, err := p.wr.TransferNotify([]xfer.Request{w}, [][]byte{[]byte("ready")}, 10*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
		t.Fatalf("notified WRITE: %v, %v, %+v", err, res[0], sum)
	}
	if moved := tcpBytes(p.d2) - before; moved >= 64<<10 {
		t.Fatalf("a notified 1 MiB WRITE moved %d bytes over tcp", moved)
	}
	if !bytes.Equal(p.expMem[p.expOff:p.expOff+1<<20], p.wMem[p.src:p.src+1<<20]) {
		t.Fatal("the notified WRITE did not land")
	}
	if notes, err := sub.PollNotifications(nil, 0, 0); err != nil || len(notes) != 1 || string(notes[0].Payload) != "ready" {
		t.Fatalf("notification: %+v, %v", notes, err)
	}
	// Fail closed: with nobody subscribed the owner refuses the
	// notification and the writer's task fails, though its bytes landed.
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if sum, err := p.wr.TransferNotify([]xfer.Request{w}, [][]byte{[]byte("anyone?")}, 10*time.Second, res); err != nil || res[0] == nil || sum.Failed != 1 {
		t.Fatalf("notification nobody subscribed to: %v, %v, %+v (want the task Failed)", err, res[0], sum)
	}
	t.Logf("refused notification over rdma: %v", res[0])
	// An export of a client's own buffer is registered on its own like a
	// pool export: once resolved, requests to it move over rdma too.
	buf, err := p.exp.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.exp.ExportSegment("own", buf.ID, 0, 0, client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	own, err := p.wr.OpenRemote("d1/own", client.RightRead|client.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	fill(rng, p.wMem[p.src:p.src+64<<10])
	w = xfer.Request{Op: xfer.OpWrite, Local: p.pool, LocalOffset: p.src, Target: own.ID, TargetOffset: 512, Length: 64 << 10}
	p.untilNoTCP(t, w)
	if !bytes.Equal(buf.Mem[512:512+64<<10], p.wMem[p.src:p.src+64<<10]) {
		t.Fatal("WRITE to a client buffer export did not land")
	}
	if !strings.Contains(p.d1.log.String(), "export registered for rdma") {
		t.Fatalf("d1 did not register the client buffer export:\n%s", p.d1.log.String())
	}
	if err := p.roundTrip(rng, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	if c := strings.Count(p.d2.log.String(), "peer requests from the pool use rdma"); c != 1 {
		t.Fatalf("the choice for d1 was logged %d times", c)
	}
	if strings.Contains(p.d2.log.String(), "rdma link closed") {
		t.Fatalf("a healthy link was retired:\n%s", p.d2.log.String())
	}

	// d1 restarts on its address (a new epoch, a new pool registration):
	// the old link is retired, the old segment fails, and the reopened one
	// gets a new link.
	addr := p.d1.d.PeerAddr()
	if err := p.d1.stop(); err != nil {
		t.Fatal(err)
	}
	old := p.rs
	p.d1 = startPeerWith(t, "d1", p.key, addr, p.mut, dialsIn("d2"))
	p.exp = p.d1.dial(t, "exporter-2")
	pi, _ := p.exp.Pool()
	offs, err := p.exp.AllocBlocks(nil, 1, p.block)
	if err != nil {
		t.Fatal(err)
	}
	p.expOff, p.expMem = offs[0], p.exp.PoolBytes()
	if _, err := p.exp.ExportSegment("kv", pi.Segment, p.expOff, p.block, client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	w = xfer.Request{Op: xfer.OpWrite, Local: p.pool, LocalOffset: p.src, Target: old.ID, Length: 4096}
	t0 := time.Now()
	if sum, err := p.wr.Transfer([]xfer.Request{w}, 20*time.Second, res); err != nil || res[0] == nil || sum.Completed != 0 {
		t.Fatalf("WRITE to the old epoch's segment: %v, %v, %+v (want it Failed)", err, res[0], sum)
	}
	failedIn := time.Since(t0)
	t.Logf("WRITE to the old epoch's segment failed after %v: %v", failedIn.Round(time.Millisecond), res[0])
	if failedIn > 5*time.Second {
		t.Fatalf("a WRITE to a restarted peer's old segment took %v to fail; d2 log:\n%s", failedIn, p.d2.log.String())
	}
	t0 = time.Now()
	if p.rs, err = p.wr.OpenRemote("d1/kv", client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	// Requests go over tcp until the new link is up and the segment
	// resolved behind them.
	p.untilRDMA(t, rng)
	t.Logf("requests to the reopened segment on rdma after %v", time.Since(t0).Round(time.Millisecond))
	if c := strings.Count(p.d2.log.String(), "rdma link up"); c != 2 {
		t.Fatalf("%d rdma links made for two epochs of d1", c)
	}
	before = tcpBytes(p.d2)
	if err := p.roundTrip(rng, 1<<20, 4096); err != nil {
		t.Fatal(err)
	}
	if moved := tcpBytes(p.d2) - before; moved != 0 {
		t.Fatalf("after the restart 1 MiB each way moved %d bytes over tcp", moved)
	}
}
