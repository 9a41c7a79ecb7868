package shm

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// vmaOf reads /proc/self/smaps for the mapping that starts at addr: its end
// and its ShmemPmdMapped bytes (the shmem it maps with 2 MiB entries). ok is
// false when no mapping starts there.
func vmaOf(t *testing.T, addr uintptr) (end uintptr, pmd uint64, ok bool) {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			if in {
				return end, pmd, true
			}
			lo, hi, _ := strings.Cut(fields[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			stop, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil {
				t.Fatalf("smaps line %q", line)
			}
			in, end = uintptr(start) == addr, uintptr(stop)
			continue
		}
		if in && len(fields) == 3 && fields[0] == "ShmemPmdMapped:" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				t.Fatalf("smaps line %q", line)
			}
			pmd = kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return end, pmd, in
}

// leftOf returns a mapping of this process that mapShared's mapping of
// [a, a+span) left behind, or "": the memfd's own mapping (named), or, when
// reserved is true, a piece of the address space mapShared reserved around
// it (anonymous, PROT_NONE, at most hugeSpan long), which ends where the
// mapping began or starts where it ended. Other threads map too (a new
// thread's stack and its guard may land in the space just given back, the
// runtime reserves heap arenas), so a mapping of another kind, place or
// length is not taken for one; a mapping under hugeSpan reserves nothing.
func leftOf(t *testing.T, a, span uintptr, name string, reserved bool) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, _ := strconv.ParseUint(lo, 16, 64)
		stop, _ := strconv.ParseUint(hi, 16, 64)
		piece := reserved && fields[1] == "---p" && fields[4] == "0" && stop-start <= hugeSpan &&
			(uintptr(stop) == a || uintptr(start) == a+span)
		if piece || strings.Contains(line, "memfd:"+name) {
			return line
		}
	}
	return ""
}

// TestMapSharedAlignsAndGivesBackItsSpan: a mapping of 2 MiB or more starts
// on a 2 MiB boundary, and unmap leaves nothing of it or of the address
// space reserved around it, for lengths on and off the boundary.
func TestMapSharedAlignsAndGivesBackItsSpan(t *testing.T) {
	for _, size := range []uint64{4 << 10, hugeSpan, 3*hugeSpan + 4<<10, 8 * hugeSpan} {
		t.Run(strconv.FormatUint(size, 10), func(t *testing.T) {
			fd, err := createMemfd("span", size, false)
			if err != nil {
				t.Fatal(err)
			}
			defer closeFd(fd)
			mem, err := mapShared(fd, size)
			if err != nil {
				t.Fatal(err)
			}
			a := uintptr(unsafe.Pointer(&mem[0]))
			if size >= hugeSpan && a%hugeSpan != 0 {
				t.Errorf("mapping of %d bytes at %#x, not on a 2 MiB boundary", size, a)
			}
			mem[len(mem)-1] = 1 // the whole length is mapped, writable
			end, _, ok := vmaOf(t, a)
			if !ok || end < a+uintptr(len(mem)) {
				t.Fatalf("no mapping of %d bytes at %#x (end %#x)", size, a, end)
			}
			span := uintptr(mappedSpan(size))
			if err := unmap(mem); err != nil {
				t.Fatal(err)
			}
			if line := leftOf(t, a, span, "span", size >= hugeSpan); line != "" {
				t.Errorf("after unmap of %#x-%#x, left mapped: %q", a, a+span, line)
			}
		})
	}
}

// TestCollapsePlacesPoolOnHugePages: a fresh pool memfd's mapping, once
// collapsed, is mapped with 2 MiB entries over its whole length, keeps its
// zeroes, and a pool made with hugepages "auto" where no hugetlb pages are
// free says so in its stats.
func TestCollapsePlacesPoolOnHugePages(t *testing.T) {
	const size = 16 << 20
	fd, mem, err := createMapping("thp", size, false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := errors.Join(unmap(mem), closeFd(fd)); err != nil {
			t.Error(err)
		}
	}()
	done, spans, err := collapse(mem)
	if errors.Is(err, unix.EINVAL) && done == 0 {
		testutil.Missing(t, testutil.THP, "the kernel refuses MADV_COLLAPSE on a memfd: %v (%s)", err, shmemEnabled())
	}
	if err != nil || done != spans || spans != size/hugeSpan {
		t.Fatalf("collapse = %d of %d spans, %v; want all %d", done, spans, err, size/hugeSpan)
	}
	_, pmd, ok := vmaOf(t, uintptr(unsafe.Pointer(&mem[0])))
	if !ok || pmd != size {
		t.Fatalf("after collapse the mapping has %d bytes on 2 MiB entries (found %v), want %d", pmd, ok, size)
	}
	for i := 0; i < size; i += 4 << 10 {
		if mem[i] != 0 {
			t.Fatalf("byte %d of a fresh pool is %d after collapse", i, mem[i])
		}
	}

	if n := hugepagesFree(t); n > 0 {
		return // an "auto" pool would take the hugetlb pages instead
	}
	p, err := NewPool(PoolConfig{ID: 3, Size: size}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if st := p.Stats(); st.THPBytes != size || st.Hugepages {
		t.Errorf("auto pool without hugetlb pages: THPBytes %d, Hugepages %v; want %d, false", st.THPBytes, st.Hugepages, size)
	}
	if _, pmd, _ := vmaOf(t, uintptr(unsafe.Pointer(&p.Bytes()[0]))); pmd != size {
		t.Errorf("auto pool maps %d bytes with 2 MiB entries, want %d", pmd, size)
	}
	// "off" keeps normal pages, faulted in lazily.
	q, err := NewPool(PoolConfig{ID: 4, Size: size, Hugepages: HugepagesOff}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if st := q.Stats(); st.THPBytes != 0 {
		t.Errorf("pool with hugepages off: THPBytes %d, want 0", st.THPBytes)
	}
}

// shmemEnabled is the kernel's shmem_enabled setting, for a skip message.
func shmemEnabled() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
	if err != nil {
		return fmt.Sprintf("no shmem_enabled: %v", err)
	}
	return "shmem_enabled: " + strings.TrimSpace(string(b))
}

// TestCollapsedClientBufferIsHugeInTheDaemon: a client's buffer placed on
// 2 MiB pages by Collapse before it is registered keeps its bytes, and the
// daemon's mapping of it (MapBuffer) takes 2 MiB entries over its whole
// spans; the part past the last whole span stays on normal pages.
func TestCollapsedClientBufferIsHugeInTheDaemon(t *testing.T) {
	const size = 3*hugeSpan + 64<<10
	fd, err := NewMemfd("client-thp", size, true)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFd(fd)
	mem, err := MapShared(fd, size)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(mem)
	done, spans, err := Collapse(mem)
	if errors.Is(err, unix.EINVAL) && done == 0 {
		testutil.Missing(t, testutil.THP, "the kernel refuses MADV_COLLAPSE on a memfd: %v (%s)", err, shmemEnabled())
	}
	if err != nil || done != 3 || spans != 3 {
		t.Fatalf("Collapse = %d of %d spans, %v; want 3 of 3", done, spans, err)
	}
	for i := range mem {
		mem[i] = byte(i ^ i>>11)
	}
	b, err := MapBuffer(7, fd, size, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := b.Bytes()
	for i := range got {
		if got[i] != byte(i^i>>11) {
			t.Fatalf("byte %d in the daemon's mapping is %d, the client wrote %d", i, got[i], byte(i^i>>11))
		}
	}
	if _, pmd, ok := vmaOf(t, uintptr(unsafe.Pointer(&got[0]))); !ok || pmd != 3*hugeSpan {
		t.Fatalf("the daemon maps %d bytes of the buffer with 2 MiB entries (found %v), want %d", pmd, ok, 3*hugeSpan)
	}
}
