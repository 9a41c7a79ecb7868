// Command compat is the Go client of the cross-client compatibility test
// (python/tests/test_compat.py runs it beside the C and Python clients
// against one daemon). It makes the same calls as c/test/compat.c:
//
//	compat write SOCKET SEED SIZE
//	    registers a buffer, writes SEED's pattern in it, moves it into a pool
//	    block with a WRITE, reads the block back into a second buffer with a
//	    READ, checks both, prints one JSON line naming the block, and holds
//	    the connection (and so the block) until stdin closes.
//	compat check SOCKET SEED OFFSET SIZE
//	    checks that the pool holds SEED's pattern at OFFSET, as written by
//	    another client, and prints one JSON line.
//
// The pattern: xorshift64 (13, 7, 17) from SEED, each state stored
// little-endian, 8 bytes at a time.
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/xfer"
)

type report struct {
	Client  string `json:"client"`
	OK      bool   `json:"ok"`
	Error   string `json:"error,omitempty"`
	Daemon  string `json:"daemon,omitempty"`
	Segment uint64 `json:"segment,omitempty"`
	Offset  uint64 `json:"offset"`
	Size    uint64 `json:"size,omitempty"`
}

func pattern(n int, seed uint64) []byte {
	out := make([]byte, n+8)
	x := seed
	if x == 0 {
		x = 1
	}
	for i := 0; i < n; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(out[i:], x)
	}
	return out[:n]
}

func emit(r report) {
	r.Client = "go"
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
}

func fail(what string, err error) int {
	emit(report{Error: fmt.Sprintf("%s: %v", what, err)})
	return 1
}

func num(s string) uint64 {
	v, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compat:", err)
		os.Exit(2)
	}
	return v
}

func write(c *client.Client, seed, size uint64) int {
	pool, _ := c.Pool()
	src, err := c.RegisterBuffer(size)
	if err != nil {
		return fail("buffer", err)
	}
	dst, err := c.RegisterBuffer(size)
	if err != nil {
		return fail("buffer", err)
	}
	copy(src.Mem, pattern(int(size), seed))
	offs, err := c.AllocBlocks(nil, 1, size)
	if err != nil {
		return fail("alloc blocks", err)
	}
	off := offs[0]
	results := make([]error, 1)
	for _, r := range []xfer.Request{
		{Op: xfer.OpWrite, Local: src.ID, Target: pool.Segment, TargetOffset: off, Length: size},
		{Op: xfer.OpRead, Local: dst.ID, Target: pool.Segment, TargetOffset: off, Length: size},
	} {
		if _, err := c.Transfer([]xfer.Request{r}, 10*time.Second, results); err != nil {
			return fail("transfer", err)
		}
		if results[0] != nil {
			return fail("transfer", results[0])
		}
	}
	ok := bytes.Equal(dst.Mem, src.Mem) && bytes.Equal(c.PoolBytes()[off:off+size], src.Mem)
	emit(report{OK: ok, Daemon: c.Hello().DaemonID, Segment: uint64(pool.Segment), Offset: off, Size: size})
	io.Copy(io.Discard, os.Stdin) //nolint:errcheck // held until stdin closes, however it closes
	if !ok {
		return 1
	}
	return 0
}

func check(c *client.Client, seed, off, size uint64) int {
	mem := c.PoolBytes()
	if off > uint64(len(mem)) || size > uint64(len(mem))-off {
		return fail("check", fmt.Errorf("[%d, +%d) outside the %d-byte pool", off, size, len(mem)))
	}
	ok := bytes.Equal(mem[off:off+size], pattern(int(size), seed))
	emit(report{OK: ok, Offset: off})
	if !ok {
		return 1
	}
	return 0
}

func main() {
	a := os.Args[1:]
	if !(len(a) == 4 && a[0] == "write") && !(len(a) == 5 && a[0] == "check") {
		fmt.Fprintln(os.Stderr, "usage: compat write SOCKET SEED SIZE | compat check SOCKET SEED OFFSET SIZE")
		os.Exit(2)
	}
	c, err := client.Dial(a[1], client.Options{Name: "compat-go"})
	if err != nil {
		os.Exit(fail("connect", err))
	}
	var rc int
	if a[0] == "write" {
		rc = write(c, num(a[2]), num(a[3]))
	} else {
		rc = check(c, num(a[2]), num(a[3]), num(a[4]))
	}
	c.Close()
	os.Exit(rc)
}
