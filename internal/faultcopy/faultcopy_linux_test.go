package faultcopy

import (
	"bytes"
	"runtime/debug"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// shrunk maps a memfd of size bytes and shrinks it to half: the mapping's
// second half then faults, as a client's buffer does when the client
// truncates it under a copy.
func shrunk(t *testing.T, size int) []byte {
	t.Helper()
	fd, err := unix.MemfdCreate("tensorcast-faultcopy-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatalf("memfd_create (the daemon's pools and client buffers are memfds): %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	for i := range mem {
		mem[i] = byte(i)
	}
	if err := unix.Ftruncate(fd, int64(size/2)); err != nil {
		t.Fatal(err)
	}
	return mem
}

func TestCopy(t *testing.T) {
	const size = 1 << 16
	for _, c := range []struct {
		name  string
		copy  func(dst, src []byte) bool
		armed bool // the goroutine sets SetPanicOnFault itself, as a worker does
	}{
		{"Guarded", Guarded, false},
		{"Copy", Copy, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.armed {
				defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
			}
			mem := shrunk(t, size)
			buf := make([]byte, size/2)
			if !c.copy(buf, mem[:size/2]) {
				t.Fatal("a copy of mapped memory reported a fault")
			}
			if !bytes.Equal(buf, mem[:size/2]) {
				t.Fatal("the copy differs from its source")
			}
			if c.copy(buf, mem[size/4:size/4+size/2]) {
				t.Fatal("a read past the truncated end reported no fault")
			}
			if c.copy(mem[size/2:], buf) {
				t.Fatal("a write past the truncated end reported no fault")
			}
			if !c.armed && debug.SetPanicOnFault(false) {
				t.Fatal("Guarded left SetPanicOnFault on")
			}
		})
	}
}

// putRecord writes a record the way a caller of Call does: in place, in
// shared memory.
func putRecord(b []byte) {
	for i := range b {
		b[i] = 0xa5
	}
}

func TestCallAndFaults(t *testing.T) {
	const size = 1 << 16
	mem := shrunk(t, size)
	before := Faults()
	if !Call(putRecord, mem[:64]) {
		t.Fatal("a write to mapped memory reported a fault")
	}
	if mem[63] != 0xa5 {
		t.Fatal("Call did not run its function")
	}
	if Call(putRecord, mem[size/2-8:size/2+8]) {
		t.Fatal("a write across the truncated end reported no fault")
	}
	if mem[size/2-1] != 0xa5 {
		t.Fatal("the bytes before the fault were not written")
	}
	if debug.SetPanicOnFault(false) {
		t.Fatal("Call left SetPanicOnFault on")
	}
	if got := Faults() - before; got != 1 {
		t.Fatalf("Faults went up by %d, want 1", got)
	}
	func() {
		defer func() {
			if r := recover(); r != "not a fault" {
				t.Fatalf("recovered %v, want the function's own panic", r)
			}
		}()
		Call(func(string) { panic("not a fault") }, "")
	}()
}

func TestStream(t *testing.T) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	src := make([]byte, 2<<20)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	dst := make([]byte, len(src)+64)
	for _, n := range []int{0, 1, 127, 128, streamMin - 1, streamMin, streamMin + 1, streamMin + 77, 1<<20 + 13} {
		for _, d := range []int{0, 1, 31, 32, 33} {
			for _, s := range []int{0, 5} {
				clear(dst)
				if !Stream(dst[d:d+n], src[s:s+n]) {
					t.Fatalf("n=%d dst+%d src+%d: a fault reported on mapped memory", n, d, s)
				}
				if !bytes.Equal(dst[d:d+n], src[s:s+n]) {
					t.Fatalf("n=%d dst+%d src+%d: the copy differs from its source", n, d, s)
				}
				if slices.ContainsFunc(dst[:d], func(b byte) bool { return b != 0 }) ||
					slices.ContainsFunc(dst[d+n:], func(b byte) bool { return b != 0 }) {
					t.Fatalf("n=%d dst+%d src+%d: bytes written outside the destination", n, d, s)
				}
			}
		}
	}
	// Overlapping slices are moved as copy moves them.
	buf := slices.Clone(src[:1<<20])
	want := slices.Clone(buf)
	copy(want[100:], want[:len(want)-100])
	if !Stream(buf[100:], buf[:len(buf)-100]) || !bytes.Equal(buf, want) {
		t.Fatal("an overlapping copy differs from copy's")
	}
}

func TestStreamFault(t *testing.T) {
	const size = 1 << 20 // a streaming copy's size
	mem := shrunk(t, size)
	buf := make([]byte, size/2)
	before := Faults()
	if !GuardedStream(buf, mem[:size/2]) || !bytes.Equal(buf, mem[:size/2]) {
		t.Fatal("a streaming copy of mapped memory failed")
	}
	if GuardedStream(buf, mem[size/4:size/4+size/2]) {
		t.Fatal("a streaming read past the truncated end reported no fault")
	}
	if GuardedStream(mem[size/4:size/4+size/2], buf) {
		t.Fatal("a streaming write past the truncated end reported no fault")
	}
	if got := Faults() - before; got != 2 {
		t.Fatalf("Faults went up by %d, want 2", got)
	}
	if debug.SetPanicOnFault(false) {
		t.Fatal("GuardedStream left SetPanicOnFault on")
	}
}
