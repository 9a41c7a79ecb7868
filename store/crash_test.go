package store

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/uring"
)

// The kill -9 test runs a real process: this test binary, re-executed with
// crashChildEnv set, opens a store on an L2 file through io_uring and puts
// durably from several goroutines, printing "ack KEY" for each put that
// returned OK. The test SIGKILLs it mid-stream, then reopens the file and
// checks every acknowledged key's bytes.

const (
	crashChildEnv = "TENSORCAST_STORE_CRASH_CHILD" // the L2 directory
	crashRunEnv   = "TENSORCAST_STORE_CRASH_RUN"   // a prefix for the child's keys
	crashL2Size   = 256 << 20
)

// crashValue is the value stored under key: its length and bytes follow
// from the key, so the verifier needs nothing but the key.
func crashValue(key string) []byte {
	sum := crc32.ChecksumIEEE([]byte(key))
	n := 1 + int(sum%(96<<10))
	v := make([]byte, n)
	x := sum | 1
	for i := range v {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		v[i] = byte(x)
	}
	return v
}

type uringEnv struct {
	pool *shm.Pool
	tr   *uring.Transport
	s    *Store
}

func openUring(dir string, cfg Config, f FileL2) (*uringEnv, error) {
	return openUringPool(dir, 64<<20, cfg, f)
}

func openUringPool(dir string, poolSize uint64, cfg Config, f FileL2) (*uringEnv, error) {
	pool, err := shm.NewPool(shm.PoolConfig{ID: poolID, Size: poolSize, Hugepages: shm.HugepagesOff,
		MinBlock: 4096, MaxBlock: 256 << 10}, nil)
	if err != nil {
		return nil, err
	}
	tr, err := uring.New(uring.Config{AllowedDirs: []string{dir}}, nil)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if f.Path == "" {
		f.Path = filepath.Join(dir, "l2.data")
	}
	if f.Size == 0 {
		f.Size = crashL2Size
	}
	f.FileID, f.StagingID = 10, 11
	if f.RegionSize == 0 {
		f.RegionSize = 8 << 20
	}
	s, err := Open(cfg, pool, tr, f)
	if err != nil {
		tr.Close()
		pool.Close()
		return nil, err
	}
	return &uringEnv{pool: pool, tr: tr, s: s}, nil
}

func (u *uringEnv) close() error {
	return errors.Join(u.s.Close(), u.tr.Close(), u.pool.Close())
}

// requireUring skips when this host has no io_uring.
func requireUring(t *testing.T) {
	t.Helper()
	tr, err := uring.New(uring.Config{}, nil)
	testutil.RequireSupported(t, testutil.IOUring, err)
	tr.Close()
}

// crashChild is the process that gets killed. It never returns.
func crashChild() {
	dir, run := os.Getenv(crashChildEnv), os.Getenv(crashRunEnv)
	u, err := openUring(dir, Config{}, FileL2{})
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(2)
	}
	fmt.Printf("ready %d\n", u.s.Stats().Keys)
	var mu sync.Mutex // one line at a time on stdout
	for g := range 4 {
		go func() {
			ss := u.s.NewSession()
			codes, errs := make([]Code, 2), make([]error, 2)
			for i := 0; ; i += 2 {
				k0 := fmt.Sprintf("%s-%d-%06d", run, g, i)
				k1 := fmt.Sprintf("%s-%d-%06d", run, g, i+1)
				keys := [][]byte{[]byte(k0), []byte(k1)}
				vals := [][]byte{crashValue(k0), crashValue(k1)}
				if _, err := ss.Put(keys, vals, true, codes, errs, nil, 0); err != nil {
					fmt.Printf("error %v\n", err)
					os.Exit(2)
				}
				mu.Lock()
				for j, c := range codes {
					if c == OK {
						fmt.Printf("ack %s\n", keys[j])
					} else {
						fmt.Printf("nack %s %v %v\n", keys[j], c, errs[j])
					}
				}
				mu.Unlock()
			}
		}()
	}
	select {}
}

// TestCrashRecovery: kill -9 during a stream of durable puts (twice, the
// second process continuing on the file the first left), then every
// acknowledged put reads back with its exact bytes.
func TestCrashRecovery(t *testing.T) {
	requireUring(t)
	dir := t.TempDir()
	var acked []string
	for round := range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, fmt.Sprintf("%s=r%d", crashRunEnv, round))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		n, killed := 0, false
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "ack "):
				acked = append(acked, line[4:])
				n++
			case strings.HasPrefix(line, "ready "):
				t.Logf("round %d: child found %s keys", round, line[6:])
			case strings.HasPrefix(line, "nack "):
				t.Logf("round %d: %s", round, line)
			default:
				t.Errorf("child: %s", line)
			}
			if n == 150+round*50 && !killed {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				killed = true
			}
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if !killed || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child ended with %v after %d acks (killed %v); stderr:\n%s", round, err, n, killed, stderr.String())
		}
		t.Logf("round %d: killed after %d acks", round, n)
	}
	for _, verify := range []bool{false, true} {
		u, err := openUring(dir, Config{}, FileL2{VerifyOnOpen: verify})
		if err != nil {
			t.Fatal(err)
		}
		st := u.s.Stats()
		t.Logf("verify=%v: recovered %d, torn %d, corrupt %d, duplicates %d", verify, st.Recovered, st.TornDropped,
			st.CorruptDropped, st.DuplicatesDropped)
		if st.Recovered < uint64(len(acked)) || st.DuplicatesDropped != 0 || verify && st.CorruptDropped != 0 {
			t.Errorf("stats %+v for %d acknowledged", st, len(acked))
		}
		dst := [][]byte{make([]byte, 96<<10)}
		lens := []uint64{0}
		codes := []Code{OK}
		errs := []error{nil}
		for _, k := range acked {
			if _, err := u.s.Read([][]byte{[]byte(k)}, dst, lens, codes, errs, nil, 0); err != nil {
				t.Fatal(err)
			}
			if codes[0] != OK {
				t.Fatalf("acknowledged %s: %v %v", k, codes[0], errs[0])
			}
			if !bytes.Equal(dst[0][:lens[0]], crashValue(k)) {
				t.Fatalf("acknowledged %s: bytes differ", k)
			}
		}
		if err := u.close(); err != nil {
			t.Fatal(err)
		}
	}
}
