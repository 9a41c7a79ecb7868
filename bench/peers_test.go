package bench

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func spawnPeersForTest(t *testing.T, rdma string, jobs []*Job) *PeerPair {
	t.Helper()
	bin := buildDaemon(t)
	p, err := SpawnPeers(PeerSpawn{Bin: bin, PoolSize: 64 << 20, RDMA: rdma, Jobs: jobs}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("peer daemons stop: %v", err)
		}
	})
	return p
}

func runEnv(t *testing.T, env *Env, jobs []*Job) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := (&Runner{Env: env}).Run(ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestTCPEngineThroughTwoDaemons runs tcp jobs as clients of daemon B
// against a buffer a client of daemon A exported, every byte checked by
// crc32c where it landed: writes (several connections), random reads,
// two clones sharing the segment with mixed sizes.
func TestTCPEngineThroughTwoDaemons(t *testing.T) {
	jobs := mustJobs(t, "--engine=tcp", "--verify=crc32c", "--size=4m",
		"--name=w", "--rw=write", "--bs=1m", "--iodepth=4", "--batch=2",
		"--name=r", "--rw=randread", "--bs=64k", "--iodepth=8", "--batch=4", "--stonewall",
		"--name=rw", "--rw=randrw", "--bsrange=4k-256k", "--iodepth=4", "--batch=1", "--numjobs=2", "--stonewall")
	p := spawnPeersForTest(t, "off", jobs)
	if len(p.Mem[p.Target]) != 8<<20 {
		t.Fatalf("exported %d bytes for %s, want 8 MiB (2 clones × 4 MiB)", len(p.Mem[p.Target]), p.Target)
	}
	env := &Env{}
	p.Env(env)
	// The write job alone first: prefill laid another pattern down, so
	// the exported buffer holds the job's pattern only if its writes
	// landed there.
	checkMoved(t, runEnv(t, env, jobs[:1]))
	exp := make([]byte, 4<<20)
	fillPattern(exp, jobs[0].RandSeed, 0)
	if string(p.Mem[p.Target][:4<<20]) != string(exp) {
		t.Fatal("the exported buffer does not hold what the write job wrote")
	}
	checkMoved(t, runEnv(t, env, jobs[1:]))
}

// TestTCPEnginePoolMem keeps the bytes in pool blocks on both daemons (as
// rdma does by default): A exports contiguous pool blocks, B's slots are
// pool blocks of the connection that sends them.
func TestTCPEnginePoolMem(t *testing.T) {
	jobs := mustJobs(t, "--engine=tcp", "--peer_mem=pool", "--verify=crc32c", "--size=8m",
		"--name=w", "--rw=write", "--bs=1m", "--iodepth=4", "--batch=2",
		"--name=r", "--rw=randread", "--bs=16k", "--iodepth=8", "--batch=4", "--numjobs=2", "--stonewall")
	p := spawnPeersForTest(t, "off", jobs)
	env := &Env{}
	p.Env(env)
	checkMoved(t, runEnv(t, env, jobs[:1]))
	exp := make([]byte, 8<<20)
	fillPattern(exp, jobs[0].RandSeed, 0)
	if string(p.Mem[p.Target][:8<<20]) != string(exp) {
		t.Fatal("the exported pool range does not hold what the write job wrote")
	}
	checkMoved(t, runEnv(t, env, jobs[1:]))
	// Without the mapping: prefill by WRITEs and read-back from the pool
	// scratch slot.
	checkMoved(t, runEnv(t, &Env{PeerSocket: p.B.Socket, PeerTarget: p.Target}, jobs))
}

// TestTCPEngineWithoutMapping addresses the target only through the
// daemons, as a run without --spawn does: prefill by WRITEs, write
// verification by reading back.
func TestTCPEngineWithoutMapping(t *testing.T) {
	jobs := mustJobs(t, "--engine=tcp", "--verify=crc32c", "--size=2m", "--target="+SpawnTargetID+"/"+SpawnSegment,
		"--name=w", "--rw=randwrite", "--bs=128k", "--iodepth=4", "--batch=2",
		"--name=r", "--rw=read", "--bs=4k", "--iodepth=1", "--stonewall")
	p := spawnPeersForTest(t, "off", jobs)
	res := runEnv(t, &Env{PeerSocket: p.B.Socket}, jobs)
	checkMoved(t, res)

	// A segment nobody exported fails with ErrNoTarget naming it.
	bad := mustJobs(t, "--name=x", "--engine=tcp", "--size=1m", "--target="+SpawnTargetID+"/nothere")
	_, err := (&Runner{Env: &Env{PeerSocket: p.B.Socket}}).Run(context.Background(), bad)
	if !errors.Is(err, ErrNoTarget) || !strings.Contains(err.Error(), "nothere") {
		t.Errorf("unexported target: %v", err)
	}
}

// TestTCPEngineVerifyCatchesCorruption changes the exported buffer behind
// the daemons' back after prefill and expects a read to fail verification.
func TestTCPEngineVerifyCatchesCorruption(t *testing.T) {
	jobs := mustJobs(t, "--name=r", "--engine=tcp", "--verify=crc32c", "--size=1m", "--rw=read", "--bs=64k")
	p := spawnPeersForTest(t, "off", jobs)
	env := &Env{}
	p.Env(env)
	eng, err := NewEngine(env, jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(jobs[0], 0, eng)
	if err := w.open(); err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	p.Mem[p.Target][5*64<<10+7] ^= 0xff
	var stop atomic.Bool
	err = w.run(&stop)
	if err == nil || !strings.Contains(err.Error(), "verify") {
		t.Fatalf("run error = %v, want a verify failure", err)
	}
}

// TestRDMAEngineWithoutDevice: rdma = on on a host without an RDMA device
// stops daemon A at start-up, and SpawnPeers says so at once.
func TestRDMAEngineWithoutDevice(t *testing.T) {
	if ents, _ := os.ReadDir("/sys/class/infiniband"); len(ents) > 0 {
		t.Skipf("this host has RDMA devices (%d in /sys/class/infiniband); the failure path needs none", len(ents))
	}
	bin := buildDaemon(t)
	jobs := mustJobs(t, "--name=r", "--engine=rdma", "--size=1m", "--rw=write")
	start := time.Now()
	p, err := SpawnPeers(PeerSpawn{Bin: bin, PoolSize: 64 << 20, RDMA: "on", RDMADevice: "rxe9", RDMAGID: "3", Jobs: jobs}, nil)
	if err == nil {
		p.Stop()
		t.Fatal("rdma = on started without an RDMA device")
	}
	if !errors.Is(err, ErrDaemon) || !strings.Contains(err.Error(), "rdma = on") || !strings.Contains(err.Error(), "--rdma on --rdma-device rxe9 --rdma-gid 3") {
		t.Errorf("error does not name the rdma start-up failure: %v", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("failing took %v", d)
	}
}

func TestPeerOptions(t *testing.T) {
	o, jobs, err := ParseArgs([]string{"--spawn", "--peer-host", "10.0.0.2", "--name=a", "--engine=tcp"})
	if err != nil || o.PeerHost != "10.0.0.2" || jobs[0].Target != "" {
		t.Fatalf("tcp without target under --spawn: %v %+v", err, o)
	}
	if err := CheckTargets(jobs); !errors.Is(err, ErrMissingOption) || !strings.Contains(err.Error(), "target") {
		t.Errorf("CheckTargets without target: %v", err)
	}
	if err := SpawnCheck(jobs); err != nil {
		t.Errorf("SpawnCheck tcp: %v", err)
	}
	if _, _, err := ParseArgs([]string{"--peer-host", "a b", "--name=a"}); !errors.Is(err, ErrBadValue) {
		t.Errorf("bad --peer-host: %v", err)
	}
	if _, _, err := ParseArgs([]string{"--name=a", "--engine=tcp", "--target=p/s/x"}); !errors.Is(err, ErrBadValue) {
		t.Errorf("target with two slashes: %v", err)
	}
	jobs = mustJobs(t, "--name=a", "--engine=tcp", "--target=p/s", "--name=b", "--engine=rdma", "--target=p/s")
	if err := SpawnCheck(jobs); !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), "separately") {
		t.Errorf("tcp and rdma in one spawned run: %v", err)
	}
	jobs = mustJobs(t, "--name=a", "--engine=tcp", "--target=p/s", "--name=b", "--engine=tcp", "--target=q/s")
	if err := SpawnCheck(jobs); !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), "q") {
		t.Errorf("two target peers in one spawned run: %v", err)
	}
	if err := CheckTargets(jobs); err != nil {
		t.Errorf("CheckTargets with targets: %v", err)
	}
	if _, _, err := ParseArgs([]string{"--name=a", "--engine=tcp", "--peer_mem=disk"}); !errors.Is(err, ErrBadValue) {
		t.Errorf("bad peer_mem: %v", err)
	}
	if jobs[0].PoolMem() || !mustJobs(t, "--name=r", "--engine=rdma")[0].PoolMem() || !mustJobs(t, "--name=p", "--engine=tcp", "--peer_mem=pool")[0].PoolMem() {
		t.Error("peer_mem defaults: tcp buffer, rdma pool")
	}
	if PeerEngineOf(jobs) != "tcp" || NeedsOneDaemon(jobs) {
		t.Errorf("PeerEngineOf/NeedsOneDaemon of tcp jobs")
	}
}

// TestTCPReferenceStreams: the tcp baseline runs iperf3 with as many
// streams as the daemons' connections per peer and says so.
func TestTCPReferenceStreams(t *testing.T) {
	testutil.Command(t, "iperf3", "iperf3")
	jobs := mustJobs(t, "--name=t", "--engine=tcp", "--bs=1m", "--numjobs=2")
	ref, err := referenceFor(nil, jobs[0], metricOf(jobs[0]))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ref.command, "-P 4 ") || !strings.Contains(ref.name, "4 connections per peer") {
		t.Errorf("tcp reference %q: %q", ref.name, ref.command)
	}
	jobs = mustJobs(t, "--name=t", "--engine=tcp", "--bs=4m")
	if ref, err = referenceFor(nil, jobs[0], metricOf(jobs[0])); err != nil || !strings.Contains(ref.command, "-l 1048576 ") {
		t.Errorf("4 MiB tcp reference: %v %+v", err, ref)
	}
}

func TestParsePerftest(t *testing.T) {
	out := []byte(` RDMA_Write BW Test
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 1048576    9132             0.00               12.76                0.001521
---------------------------------------------------------------------------------------
`)
	if v, err := ParsePerftest(out); err != nil || v != 12.76 {
		t.Errorf("ParsePerftest = %v, %v; want 12.76", v, err)
	}
	if _, err := ParsePerftest([]byte("No IB devices found\n")); !errors.Is(err, ErrToolOutput) || !strings.Contains(err.Error(), "No IB devices") {
		t.Errorf("no result: %v", err)
	}
}

// TestPerftestWithoutDevice: with perftest installed and no RDMA device,
// the reference run fails with the tool's own words, promptly.
func TestPerftestWithoutDevice(t *testing.T) {
	testutil.Command(t, "ib_write_bw", "perftest")
	if ents, _ := os.ReadDir("/sys/class/infiniband"); len(ents) > 0 {
		t.Skipf("this host has RDMA devices (%d in /sys/class/infiniband); the failure path needs none", len(ents))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := RunPerftest(ctx, "ib_write_bw", 1, 65536)
	if !errors.Is(err, ErrToolOutput) || !strings.Contains(strings.ToLower(err.Error()), "device") {
		t.Errorf("perftest without a device: %v", err)
	}
}

// TestRDMAEngineRefusesTCP: an rdma job whose requests stay on tcp (here
// both daemons run with rdma = off, as they would without a link) fails
// in Open, naming the peer, instead of reporting tcp figures as rdma.
func TestRDMAEngineRefusesTCP(t *testing.T) {
	jobs := mustJobs(t, "--name=w", "--engine=rdma", "--size=1m", "--rw=write", "--bs=64k", "--iodepth=4", "--batch=2")
	p := spawnPeersForTest(t, "off", jobs)
	defer func(d time.Duration) { rdmaReadyWait = d }(rdmaReadyWait)
	rdmaReadyWait = 300 * time.Millisecond
	env := &Env{}
	p.Env(env)
	start := time.Now()
	_, err := (&Runner{Env: env}).Run(context.Background(), jobs)
	if !errors.Is(err, ErrEngineUnavailable) || !strings.Contains(err.Error(), "still move over tcp") ||
		!strings.Contains(err.Error(), SpawnTargetID) {
		t.Fatalf("rdma job carried by tcp: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("refusing took %v", d)
	}
	// The same job as tcp runs: the requests themselves were fine.
	jobs[0].Engine = "tcp"
	checkMoved(t, runEnv(t, env, jobs))
}

// TestRDMADeviceOptions: --rdma-device and --rdma-gid reach the perftest
// baseline as -d and -x (an index only).
func TestRDMADeviceOptions(t *testing.T) {
	o, _, err := ParseArgs([]string{"--rdma-device", "rxe0", "--rdma-gid=1", "--name=r", "--engine=rdma"})
	if err != nil || o.RDMADevice != "rxe0" || o.RDMAGID != "1" {
		t.Fatalf("parse: %v %+v", err, o)
	}
	if _, _, err := ParseArgs([]string{"--rdma-device", "a/b", "--name=r"}); !errors.Is(err, ErrBadValue) {
		t.Errorf("bad --rdma-device: %v", err)
	}
	for _, c := range []struct {
		env  *Env
		want string
	}{
		{nil, ""},
		{&Env{RDMADevice: "rxe0", RDMAGID: "1"}, "-d rxe0 -x 1"},
		{&Env{RDMADevice: "rxe0", RDMAGID: "::ffff:10.0.2.15"}, "-d rxe0"},
		{&Env{RDMAGID: "2"}, "-x 2"},
	} {
		if got := strings.Join(perftestDevice(c.env), " "); got != c.want {
			t.Errorf("perftestDevice(%+v) = %q, want %q", c.env, got, c.want)
		}
	}
	testutil.Command(t, "ib_write_bw", "perftest")
	jobs := mustJobs(t, "--name=r", "--engine=rdma", "--rw=write", "--bs=64k", "--runtime=2s")
	ref, err := referenceFor(&Env{RDMADevice: "rxe0", RDMAGID: "1"}, jobs[0], metricOf(jobs[0]))
	if err != nil {
		t.Fatal(err)
	}
	if ref.command != "ib_write_bw -d rxe0 -x 1 -s 65536 -D 2 --report_gbits 127.0.0.1" || !strings.Contains(ref.name, "-d rxe0") {
		t.Errorf("rdma reference %q: %q", ref.name, ref.command)
	}
}
