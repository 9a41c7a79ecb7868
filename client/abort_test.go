package client

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// storeDaemon is a control server with a KV block store (L1 only) over its
// real pool, its retention handles and placement leases, and a mode.
type storeDaemon struct {
	sock string
	pool *shm.Pool
	s    *store.Store
	g    *grant.Grants
	srv  *control.Server
}

// startStoreDaemon starts a storeDaemon; cfgs change the store's config.
func startStoreDaemon(t *testing.T, cfgs ...func(*store.Config)) *storeDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "tccl")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	d := &storeDaemon{sock: filepath.Join(dir, "d.sock")}
	d.pool, err = shm.NewPool(shm.PoolConfig{ID: poolID, Size: 32 << 20, Hugepages: shm.HugepagesOff}, log)
	if err != nil {
		t.Fatal(err)
	}
	var scfg store.Config
	for _, f := range cfgs {
		f(&scfg)
	}
	if d.s, err = store.New(scfg, d.pool, nil); err != nil {
		t.Fatal(err)
	}
	pin := grant.StorePinner{Store: d.s}
	h, err := grant.NewHandles(grant.HandlesConfig{DaemonID: "d-1", Epoch: 1, Key: []byte("a test cluster's key"), Pinner: pin})
	if err != nil {
		t.Fatal(err)
	}
	l, err := grant.NewLeases(grant.LeasesConfig{Pinner: pin})
	if err != nil {
		t.Fatal(err)
	}
	d.g = &grant.Grants{Handles: h, Leases: l}
	adm, err := grant.NewAdmission(grant.BudgetedHybrid, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := xfer.NewRegistry()
	reg.Add(d.pool)
	tr := xfer.NewLocal(xfer.LocalConfig{Workers: 1}, log)
	eng := xfer.NewEngine(xfer.Config{}, xfertest.RouteAll(tr), log)
	d.srv, err = control.NewServer(control.Config{Socket: d.sock, DaemonID: "d-1", Version: "v-test"},
		control.Deps{Engine: eng, Pool: d.pool, Registry: reg, Store: d.s, Grants: d.g, Admission: adm}, log)
	if err != nil {
		t.Fatal(err)
	}
	d.srv.Start()
	t.Cleanup(func() {
		d.srv.Close() // the connections' sessions close first
		d.g.Close()
		if err := d.s.Close(); err != nil {
			t.Errorf("store close: %v", err)
		}
		eng.Close()
		tr.Close()
		d.pool.Close()
		os.RemoveAll(dir)
	})
	return d
}

// TestStoreAbort: through a daemon, reservations given back with
// StoreAbort free their pool blocks at once, with the connection still
// open; a key never reserved, another connection's reservation (left
// untouched, committed after) and a key aborted already are refused per
// key; a commit after the abort finds nothing, and the key can be reserved
// and committed again; a batch with an invalid key is refused whole.
func TestStoreAbort(t *testing.T) {
	d := startStoreDaemon(t)
	a, err := Dial(d.sock, Options{Name: "aborter"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Dial(d.sock, Options{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	theirs := [][]byte{[]byte("theirs")}
	offs := make([]uint64, 2)
	res := make([]error, 4)
	if err := b.StoreReserve(theirs, []uint64{4096}, offs[:1], res[:1]); err != nil || res[0] != nil {
		t.Fatalf("reserve theirs: %v %v", err, res[0])
	}
	copy(b.PoolBytes()[offs[0]:], bytes.Repeat([]byte{9}, 4096))
	blocks := d.pool.Stats().Blocks

	mine := [][]byte{[]byte("mine-0"), []byte("mine-1")}
	if err := a.StoreReserve(mine, []uint64{4096, 100 << 10}, offs, res[:2]); err != nil || res[0] != nil || res[1] != nil {
		t.Fatalf("reserve: %v %v", err, res[:2])
	}
	if got := d.pool.Stats().Blocks; got != blocks+2 {
		t.Fatalf("%d pool blocks after reserving two, want %d", got, blocks+2)
	}
	batch := [][]byte{mine[0], []byte("never"), theirs[0], mine[1]}
	if err := a.StoreAbort(batch, res); err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, ErrFailedPrecondition, ErrFailedPrecondition, nil} {
		if !errors.Is(res[i], want) || want == nil && res[i] != nil {
			t.Fatalf("abort key %d (%s): %v, want %v", i, batch[i], res[i], want)
		}
	}
	if got := d.pool.Stats().Blocks; got != blocks {
		t.Fatalf("%d pool blocks after the abort, want %d", got, blocks)
	}
	if st := d.s.Stats(); st.Reserved != 1 || st.Aborted != 2 {
		t.Fatalf("store stats %+v", st)
	}

	if err := a.StoreAbort(mine, res[:2]); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res[0], ErrFailedPrecondition) || !errors.Is(res[1], ErrFailedPrecondition) {
		t.Fatalf("abort twice: %v", res[:2])
	}
	if err := a.StoreCommit(mine[:1], false, res[:1]); err != nil || !errors.Is(res[0], ErrFailedPrecondition) {
		t.Fatalf("commit after abort: %v %v", err, res[0])
	}
	if err := b.StoreCommit(theirs, false, res[:1]); err != nil || res[0] != nil {
		t.Fatalf("the other connection's commit: %v %v", err, res[0])
	}
	if v, err := a.GetBytes(theirs[0]); err != nil || !bytes.Equal(v, bytes.Repeat([]byte{9}, 4096)) {
		t.Fatalf("the other connection's value: %d bytes, %v", len(v), err)
	}

	// Reserved again and committed: the aborted key is free.
	if err := a.StoreReserve(mine[:1], []uint64{10}, offs[:1], res[:1]); err != nil || res[0] != nil {
		t.Fatalf("reserve again: %v %v", err, res[0])
	}
	copy(a.PoolBytes()[offs[0]:], "0123456789")
	if err := a.StoreCommit(mine[:1], false, res[:1]); err != nil || res[0] != nil {
		t.Fatalf("commit again: %v %v", err, res[0])
	}
	if v, err := a.GetBytes(mine[0]); err != nil || string(v) != "0123456789" {
		t.Fatalf("value after reserving again: %q %v", v, err)
	}

	// An invalid key refuses the whole batch, and its valid key stays
	// reserved.
	if err := a.StoreReserve(mine[1:], []uint64{10}, offs[:1], res[:1]); err != nil || res[0] != nil {
		t.Fatalf("reserve: %v %v", err, res[0])
	}
	if err := a.StoreAbort([][]byte{mine[1], make([]byte, 300)}, res[:2]); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("abort with a 300-byte key: %v, want ErrInvalidArgument", err)
	}
	if st := d.s.Stats(); st.Reserved != 1 {
		t.Fatalf("a refused abort released something: %+v", st)
	}
	st, err := a.Stats()
	if err != nil {
		t.Fatal(err)
	}
	counters := map[string]uint64{}
	for _, k := range st.Store {
		counters[k.Name] = k.Value
	}
	if counters["aborted"] != 2 || counters["reserved"] != 1 {
		t.Fatalf("store counters %v", counters)
	}
}
