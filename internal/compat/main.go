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
//	compat store-write SOCKET PREFIX SEED SIZE
//	    stores PREFIX/sock with a copying put on the socket (SEED's pattern,
//	    from a buffer) and PREFIX/queue zero-copy through a queue (reserve,
//	    SEED+1's pattern written in place, durable commit), and prints one
//	    JSON line.
//	compat store-check SOCKET PREFIX SEED SIZE
//	    reads another client's keys back: a copying read on the socket and a
//	    get in place through a queue (its results records, then an unpin), an
//	    exists and a lookup_prefix through the queue and a stat, and prints
//	    one JSON line of what each answered; every client's line about the
//	    same keys must be the same.
//
// The pattern: xorshift64 (13, 7, 17) from SEED, each state stored
// little-endian, 8 bytes at a time.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
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

// storeReport is what store-check prints: the same fields, in the same
// order, as the C and Python clients print.
type storeReport struct {
	Client      string   `json:"client"`
	OK          bool     `json:"ok"`
	Error       string   `json:"error,omitempty"`
	ReadCodes   []int    `json:"read_codes"`
	ReadLengths []uint64 `json:"read_lengths"`
	ReadSHA     []string `json:"read_sha"`
	GetRecords  []string `json:"get_records"`
	GetSHA      []string `json:"get_sha"`
	Exists      []int    `json:"exists"`
	Prefix      uint64   `json:"prefix"`
	StatSize    uint64   `json:"stat_size"`
	StatL2      bool     `json:"stat_l2"`
}

func digest(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func codeOf(err error) int {
	var se *client.StatusError
	if err == nil {
		return 0
	}
	if errors.As(err, &se) {
		return int(se.Code)
	}
	return -1
}

// call stages one store op with stage and reaps its completion.
func call(q *client.Queue, stage func() (bool, error)) (client.Completion, error) {
	ok, err := stage()
	if err == nil && !ok {
		err = fmt.Errorf("the queue took nothing")
	}
	if err != nil {
		return client.Completion{}, err
	}
	out := make([]client.Completion, 1)
	if _, err := q.Reap(out, 1, 10*time.Second); err != nil {
		return client.Completion{}, err
	}
	return out[0], nil
}

func storeWrite(c *client.Client, prefix string, seed, size uint64) int {
	sock, qk := [][]byte{[]byte(prefix + "/sock")}, [][]byte{[]byte(prefix + "/queue")}
	buf, err := c.RegisterBuffer(size)
	if err != nil {
		return fail("buffer", err)
	}
	copy(buf.Mem, pattern(int(size), seed))
	res := []error{nil}
	if err := c.StorePut(sock, []client.Extent{{Segment: buf.ID, Length: size}}, false, res); err != nil || res[0] != nil {
		return fail("store put", errors.Join(err, res[0]))
	}
	q, err := c.OpenQueue(8)
	if err != nil {
		return fail("queue", err)
	}
	r, err := c.NewResults(4)
	if err != nil {
		return fail("results", err)
	}
	comp, err := call(q, func() (bool, error) { return q.Reserve(qk, size, r, 1) })
	if err == nil {
		err = r.Check(comp)
	}
	if err == nil {
		err = r.Err(0)
	}
	if err != nil {
		return fail("reserve", err)
	}
	copy(r.Value(0), pattern(int(size), seed+1))
	comp, err = call(q, func() (bool, error) { return q.Commit(qk, true, r, 2) })
	if err == nil {
		err = r.Check(comp)
	}
	if err == nil {
		err = r.Err(0)
	}
	if err != nil {
		return fail("commit", err)
	}
	emit(report{OK: true, Size: size})
	return 0
}

func storeCheck(c *client.Client, prefix string, seed, size uint64) int {
	keys := [][]byte{[]byte(prefix + "/queue"), []byte(prefix + "/sock"), []byte(prefix + "/none")}
	want := [][]byte{pattern(int(size), seed+1), pattern(int(size), seed)}
	rep := storeReport{Client: "go", OK: true}
	bad := func(what string, err error) int {
		rep.OK, rep.Error = false, fmt.Sprintf("%s: %v", what, err)
		b, _ := json.Marshal(rep)
		fmt.Println(string(b))
		return 1
	}
	// A copying read on the socket.
	buf, err := c.RegisterBuffer(3 * size)
	if err != nil {
		return bad("buffer", err)
	}
	dests := []client.Extent{{Segment: buf.ID, Length: size}, {Segment: buf.ID, Offset: size, Length: size},
		{Segment: buf.ID, Offset: 2 * size, Length: size}}
	lens, res := make([]uint64, 3), make([]error, 3)
	if err := c.StoreRead(keys, dests, lens, res); err != nil {
		return bad("store read", err)
	}
	for i := range keys {
		rep.ReadCodes = append(rep.ReadCodes, codeOf(res[i]))
		rep.ReadLengths = append(rep.ReadLengths, lens[i])
		if res[i] == nil {
			got := buf.Mem[uint64(i)*size : uint64(i)*size+lens[i]]
			rep.ReadSHA = append(rep.ReadSHA, digest(got))
			rep.OK = rep.OK && bytes.Equal(got, want[i])
		}
	}
	// A get in place through a queue, its records, then the unpin.
	q, err := c.OpenQueue(8)
	if err != nil {
		return bad("queue", err)
	}
	r, err := c.NewResults(4)
	if err != nil {
		return bad("results", err)
	}
	comp, err := call(q, func() (bool, error) { return q.Get(keys, r, 1) })
	if err == nil {
		err = r.Check(comp)
	}
	if err != nil {
		return bad("get", err)
	}
	var pinned [][]byte
	for i := range keys {
		off, l := r.Location(i)
		rec := make([]byte, 16)
		rec[0] = byte(r.Code(i))
		binary.LittleEndian.PutUint32(rec[4:], uint32(l))
		binary.LittleEndian.PutUint64(rec[8:], off)
		rep.GetRecords = append(rep.GetRecords, hex.EncodeToString(rec))
		if r.Err(i) == nil {
			rep.GetSHA = append(rep.GetSHA, digest(r.Value(i)))
			rep.OK = rep.OK && bytes.Equal(r.Value(i), want[i])
			pinned = append(pinned, keys[i])
		}
	}
	if len(pinned) > 0 {
		comp, err = call(q, func() (bool, error) { return q.Unpin(pinned, r, 2) })
		if err == nil {
			err = r.Check(comp)
		}
		if err != nil {
			return bad("unpin", err)
		}
	}
	// Exists and lookup_prefix through the queue; a stat on the socket.
	comp, err = call(q, func() (bool, error) { return q.Exists(keys, r, 3) })
	if err == nil {
		err = r.Check(comp)
	}
	if err != nil {
		return bad("exists", err)
	}
	for i := range keys {
		rep.Exists = append(rep.Exists, int(r.Code(i)))
	}
	chain := [][]byte{keys[1], keys[0], keys[2]}
	comp, err = call(q, func() (bool, error) { return q.LookupPrefix(chain, false, 4) })
	if err == nil && comp.Code != 0 {
		err = fmt.Errorf("code %d", comp.Code)
	}
	if err != nil {
		return bad("lookup prefix", err)
	}
	rep.Prefix = comp.N
	info, err := c.StoreStat(keys[0])
	if err != nil {
		return bad("stat", err)
	}
	rep.StatSize, rep.StatL2 = info.Size, info.InL2
	b, _ := json.Marshal(rep)
	fmt.Println(string(b))
	if !rep.OK {
		return 1
	}
	return 0
}

func main() {
	a := os.Args[1:]
	store := len(a) == 5 && (a[0] == "store-write" || a[0] == "store-check")
	if !(len(a) == 4 && a[0] == "write") && !(len(a) == 5 && a[0] == "check") && !store {
		fmt.Fprintln(os.Stderr, "usage: compat write SOCKET SEED SIZE | compat check SOCKET SEED OFFSET SIZE |\n"+
			"       compat store-write SOCKET PREFIX SEED SIZE | compat store-check SOCKET PREFIX SEED SIZE")
		os.Exit(2)
	}
	c, err := client.Dial(a[1], client.Options{Name: "compat-go"})
	if err != nil {
		os.Exit(fail("connect", err))
	}
	var rc int
	switch a[0] {
	case "write":
		rc = write(c, num(a[2]), num(a[3]))
	case "check":
		rc = check(c, num(a[2]), num(a[3]), num(a[4]))
	case "store-write":
		rc = storeWrite(c, a[2], num(a[3]), num(a[4]))
	case "store-check":
		rc = storeCheck(c, a[2], num(a[3]), num(a[4]))
	}
	c.Close()
	os.Exit(rc)
}
