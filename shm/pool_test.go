//go:build linux

package shm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

func TestPoolConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  PoolConfig
		want error
	}{
		{"zero id", PoolConfig{Size: mib}, ErrInvalidConfig},
		{"zero size", PoolConfig{ID: 1}, ErrInvalidConfig},
		{"bad hugepages", PoolConfig{ID: 1, Size: mib, Hugepages: "yes"}, ErrInvalidConfig},
		{"min not power of two", PoolConfig{ID: 1, Size: mib, MinBlock: 3000}, ErrInvalidConfig},
		{"max not power of two", PoolConfig{ID: 1, Size: mib, MaxBlock: 3 * mib}, ErrInvalidConfig},
		{"min above max", PoolConfig{ID: 1, Size: mib, MinBlock: 2 * mib, MaxBlock: mib}, ErrInvalidConfig},
		{"max above 1 GiB", PoolConfig{ID: 1, Size: 4 << 30, MaxBlock: 2 << 30}, ErrInvalidConfig},
		{"too many blocks per slab", PoolConfig{ID: 1, Size: mib, MinBlock: 1, MaxBlock: mib}, ErrInvalidConfig},
		{"size overflows", PoolConfig{ID: 1, Size: math.MaxUint64}, ErrInvalidConfig},
		{"name with a slash", PoolConfig{ID: 1, Size: mib, Name: "a/b"}, ErrInvalidConfig},
	} {
		p, err := NewPool(tt.cfg, nil)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: NewPool(%+v) = %v, want %v", tt.name, tt.cfg, err, tt.want)
		}
		if p != nil {
			t.Errorf("%s: got a pool with an error", tt.name)
			_ = p.Close()
		}
	}
}

func TestPoolDefaultsAndRounding(t *testing.T) {
	p, err := NewPool(PoolConfig{ID: 3, Size: 5 * mib, Hugepages: HugepagesOff}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Size() != 8*mib || len(p.Bytes()) != 8*mib || p.ID() != 3 || p.Kind() != xfer.KindPool {
		t.Fatalf("pool: size %d, mapping %d, id %d, kind %v", p.Size(), len(p.Bytes()), p.ID(), p.Kind())
	}
	st := p.Stats()
	if len(st.Classes) != 11 || st.Classes[0].BlockSize != DefaultMinBlock || st.Classes[10].BlockSize != DefaultMaxBlock {
		t.Fatalf("default classes: %+v", st.Classes)
	}
}

// TestPoolNamed: a named pool's memfd carries the name, so an operator can
// tell the tenants' pools apart in /proc.
func TestPoolNamed(t *testing.T) {
	p, err := NewPool(PoolConfig{ID: 4, Size: mib, Hugepages: HugepagesOff, Name: "team-a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", p.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(link, "memfd:tensorcast-pool-team-a") {
		t.Fatalf("pool memfd is %q, want its name", link)
	}
}

// TestPoolFdSealed: a client holding the pool's fd can map it and sees the
// daemon's bytes, but cannot change its size or add seals.
func TestPoolFdSealed(t *testing.T) {
	p := newTestPool(t, 2, 4*kib, 64*kib)
	fd, err := unix.Dup(p.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4*kib); !errors.Is(err, unix.EPERM) {
		t.Errorf("client ftruncate (shrink) = %v, want EPERM", err)
	}
	if err := unix.Ftruncate(fd, int64(p.Size())*2); !errors.Is(err, unix.EPERM) {
		t.Errorf("client ftruncate (grow) = %v, want EPERM", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); !errors.Is(err, unix.EPERM) {
		t.Errorf("client F_ADD_SEALS = %v, want EPERM", err)
	}
	client, err := MapShared(fd, p.Size())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := Unmap(client); err != nil {
			t.Error(err)
		}
	}()
	off, err := p.Alloc(8 * kib)
	if err != nil {
		t.Fatal(err)
	}
	copy(client[off:], "written by the client")
	if got := string(p.Bytes()[off : off+21]); got != "written by the client" {
		t.Errorf("daemon sees %q", got)
	}
}

func TestPoolPrefault(t *testing.T) {
	p, err := NewPool(PoolConfig{ID: 4, Size: 8 * mib, Hugepages: HugepagesOff, Prefault: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// mincore on a shared mapping reports resident pages: all of them.
	vec := make([]byte, p.Size()/uint64(os.Getpagesize()))
	mem := p.Bytes()
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)),
		uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(os.NewSyscallError("mincore", errno))
	}
	for i, v := range vec {
		if v&1 == 0 {
			t.Fatalf("page %d of a prefaulted pool is not resident", i)
		}
	}
}

func TestPoolCloseWithRefs(t *testing.T) {
	p, err := NewPool(PoolConfig{ID: 5, Size: 4 * mib, Hugepages: HugepagesOff}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Acquire() {
		t.Fatal("Acquire on an open pool failed")
	}
	mem := p.Bytes()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if p.Acquire() {
		t.Fatal("Acquire after Close succeeded")
	}
	if _, err := p.Alloc(4 * kib); !errors.Is(err, ErrClosed) || !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("Alloc after Close = %v, want ErrClosed", err)
	}
	if err := p.AllocN(4*kib, make([]uint64, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("AllocN after Close = %v, want ErrClosed", err)
	}
	// The held reference keeps the mapping (and the memfd) alive.
	mem[0], mem[len(mem)-1] = 1, 2
	if !isMapped(t, mem) {
		t.Fatal("mapping gone while a reference is held")
	}
	if _, err := unix.FcntlInt(uintptr(p.Fd()), unix.F_GETFD, 0); err != nil {
		t.Fatalf("memfd closed while a reference is held: %v", err)
	}
	p.Release()
	if isMapped(t, mem) {
		t.Fatal("mapping still there after the last Release")
	}
}

// isMapped reports whether mem's first byte is inside a file-backed (memfd
// or file) mapping of this process, from /proc/self/maps. Anonymous memory
// the runtime might map at the same address later does not count.
func isMapped(t *testing.T, mem []byte) bool {
	t.Helper()
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		rng, _, _ := strings.Cut(line, " ")
		lo, hi, _ := strings.Cut(rng, "-")
		l, err1 := strconv.ParseUint(lo, 16, 64)
		h, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad maps line %q", line)
		}
		if addr >= l && addr < h {
			fields := strings.Fields(line)
			return len(fields) >= 6 && strings.HasPrefix(fields[5], "/")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return false
}

func TestRefsTeardownOnce(t *testing.T) {
	for range 200 {
		var r refs
		var teardowns int
		var mu sync.Mutex
		down := func() {
			mu.Lock()
			teardowns++
			mu.Unlock()
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 50 {
					if !r.acquire() {
						return
					}
					if r.release() {
						down()
					}
				}
			}()
		}
		if first, now := r.close(); !first {
			t.Fatal("first close not reported as first")
		} else if now {
			down()
		}
		if first, now := r.close(); first || now {
			t.Fatalf("second close = %v, %v", first, now)
		}
		wg.Wait()
		if teardowns != 1 {
			t.Fatalf("%d teardowns, want exactly 1", teardowns)
		}
	}
}

func TestRefsUnmatchedReleasePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Release without Acquire did not panic")
		}
	}()
	var r refs
	r.release()
}

// hugepagesFree reads the free 2 MiB hugepages.
func hugepagesFree(t *testing.T) int {
	t.Helper()
	return readSysInt(t, "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
}

func readSysInt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		testutil.Missing(t, testutil.Hugepages, "no 2 MiB hugepage support in this kernel (%v)", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestHugepagesOnFailsWithoutPages(t *testing.T) {
	if n := hugepagesFree(t); n > 0 {
		t.Skipf("this host has %d free 2 MiB hugepages reserved; the failure path needs none", n)
	}
	before, _ := fdCount()
	p, err := NewPool(PoolConfig{ID: 1, Size: 8 * mib, Hugepages: HugepagesOn}, nil)
	if !errors.Is(err, ErrNoHugepages) || p != nil {
		t.Fatalf("NewPool(hugepages on) with none reserved = %v, %v; want ErrNoHugepages", p, err)
	}
	if !strings.Contains(err.Error(), "vm.nr_hugepages") {
		t.Errorf("error does not tell the operator what to do: %v", err)
	}
	if after, _ := fdCount(); after != before {
		t.Errorf("failed NewPool leaked fds: %d before, %d after", before, after)
	}
	// "on" with a size hugepages cannot back fails before trying.
	_, err = NewPool(PoolConfig{ID: 1, Size: mib, MaxBlock: mib, Hugepages: HugepagesOn}, nil)
	if !errors.Is(err, ErrNoHugepages) {
		t.Errorf("NewPool(hugepages on, 1 MiB) = %v, want ErrNoHugepages", err)
	}
	// "auto" falls back to transparent huge pages (or, where the kernel
	// refuses those, normal pages) and says why, once.
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	p, err = NewPool(PoolConfig{ID: 1, Size: 8 * mib}, log)
	if err != nil {
		t.Fatalf("NewPool(hugepages auto) without hugepages: %v", err)
	}
	defer p.Close()
	if p.Stats().Hugepages || p.Hugepages() {
		t.Error("auto pool claims hugepages with none reserved")
	}
	out := logs.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "transparent huge pages") || !strings.Contains(out, "hugepages unavailable") {
		t.Errorf("log does not say once which pages and why:\n%s", out)
	}
	if _, err := p.Alloc(mib); err != nil {
		t.Errorf("fallback pool does not allocate: %v", err)
	}
}

// TestHugepagesReal raises vm.nr_hugepages for the length of the test to
// prove the hugetlb path works, then restores it.
func TestHugepagesReal(t *testing.T) {
	const path = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
	const pages = 4
	testutil.Require(t, testutil.Root) // to raise vm.nr_hugepages
	old := readSysInt(t, path)
	if err := os.WriteFile(path, []byte(strconv.Itoa(old+pages)), 0); err != nil {
		testutil.Missing(t, testutil.Hugepages, "cannot raise %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(path, []byte(strconv.Itoa(old)), 0); err != nil {
			t.Errorf("restoring %s to %d: %v", path, old, err)
		}
	})
	free := hugepagesFree(t)
	if free < pages {
		testutil.Missing(t, testutil.Hugepages, "raised %s by %d but the kernel found only %d free 2 MiB pages", path, pages, free)
	}
	var logs bytes.Buffer
	p, err := NewPool(PoolConfig{ID: 9, Size: pages * HugepageSize, Hugepages: HugepagesOn, Prefault: true},
		slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("NewPool(hugepages on) with %d free hugepages: %v", free, err)
	}
	defer func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	}()
	if !p.Stats().Hugepages || !strings.Contains(logs.String(), "hugetlb") {
		t.Fatalf("pool not on hugepages: %+v, log %s", p.Stats(), logs.String())
	}
	if got := hugepagesFree(t); got != free-pages {
		t.Errorf("free hugepages %d after a prefaulted %d-page pool, want %d", got, pages, free-pages)
	}
	off, err := p.Alloc(mib)
	if err != nil {
		t.Fatal(err)
	}
	copy(p.Bytes()[off:], "on hugepages")
	if string(p.Bytes()[off:off+12]) != "on hugepages" {
		t.Error("hugepage pool lost a write")
	}
	if err := p.Free(off); err != nil {
		t.Error(err)
	}
}
