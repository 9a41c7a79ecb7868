package bench

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
)

// TestStoreEngineAgainstDaemon runs the store engine as a real client of a
// spawned tensorcastd with every byte checked by crc32c: zero-copy puts
// (durable and not), gets at batch 1 and 8 with iodepth above the batch,
// random rewrites of blocks (each a new key, the superseded ones removed)
// and two clones.
func TestStoreEngineAgainstDaemon(t *testing.T) {
	jobs := mustJobs(t, "--engine=store", "--verify=crc32c", "--size=4m",
		"--name=s-put", "--rw=write", "--bs=64k", "--iodepth=8", "--batch=8",
		"--name=s-put-durable", "--rw=write", "--bs=16k", "--iodepth=4", "--batch=2", "--durable", "--stonewall",
		"--name=s-get", "--rw=randread", "--bs=4k", "--iodepth=16", "--batch=8", "--numjobs=2", "--stonewall",
		"--name=s-get-1", "--rw=read", "--bs=64k", "--iodepth=4", "--batch=1", "--stonewall",
		"--name=s-rewrite", "--rw=randrw", "--bs=4k", "--iodepth=8", "--batch=4", "--runtime=400ms", "--time_based", "--stonewall")
	d := spawnForTest(t, jobs)
	res := runAgainst(t, d, jobs)
	checkMoved(t, res)
}

// TestStoreEngineJobChecks: a store job needs one bs dividing its size.
func TestStoreEngineJobChecks(t *testing.T) {
	for _, args := range [][]string{
		{"--name=a", "--engine=store", "--bsrange=4k-64k"},
		{"--name=a", "--engine=store", "--bs=48k", "--size=1m"},
	} {
		if _, _, err := ParseArgs(args); !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), "store") {
			t.Errorf("%v: %v, want a bad value naming the store engine", args, err)
		}
	}
}

// TestStoreEngineVerifyCatchesCorruption corrupts a stored value in the
// pool behind the store's back and expects a read job's verify to fail.
func TestStoreEngineVerifyCatchesCorruption(t *testing.T) {
	jobs := mustJobs(t, "--name=r", "--engine=store", "--verify=crc32c", "--size=1m", "--rw=read", "--bs=64k")
	d := spawnForTest(t, jobs)
	eng, err := NewEngine(&Env{Socket: d.Socket}, jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(jobs[0], 0, eng)
	if err := w.open(); err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	se := eng.(*storeEngine)
	cl := &se.calls[0]
	key := [][]byte{se.appendKey(nil, 3*64<<10, se.gens[3])}
	if ok, err := se.q.Get(key, cl.res, 99); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if n, err := se.q.Reap(se.cqes[:1], 1, waitTimeout); n != 1 || err != nil || cl.res.Check(se.cqes[0]) != nil || cl.res.Code(0) != 0 {
		t.Fatalf("get %s: %v %+v", key[0], err, se.cqes[0])
	}
	cl.res.Value(0)[100] ^= 0xff
	if ok, err := se.q.Unpin(key, cl.res, 98); !ok || err != nil {
		t.Fatal(ok, err)
	}
	se.q.Reap(se.cqes[:1], 1, waitTimeout)
	var stop atomic.Bool
	err = w.run(&stop)
	if err == nil || !strings.Contains(err.Error(), "verify") {
		t.Fatalf("run error = %v, want a verify failure", err)
	}
}
