package tcp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestWriterBlockedOnAFullSocket: a peer that stops reading once
// authenticated fills the socket, and the connection's writer waits for
// room. The tasks still end, by their deadline plus stallGrace (the
// reaper drops the silent connection, which wakes the writer); the node
// then closes without waiting, and every descriptor it opened, the
// writer's duplicate too, is closed.
func TestWriterBlockedOnAFullSocket(t *testing.T) {
	before := openFDs(t)
	key := []byte("k")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	a, err := NewNode(Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: kf, ConnsPerPeer: 1,
		SliceSize: 1 << 20, MaxInflightBytes: 64 << 20, MaxPeerInflightBytes: 64 << 20, RequestTimeout: 30 * time.Second},
		newExporter(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	stop := make(chan struct{})
	fake := newFakePeer(t, "deaf", key, func(net.Conn, header, []byte) bool {
		<-stop // reads nothing more
		return false
	})
	if err := a.Directory().Update(dirPeer("deaf", fake.ln.Addr().String())); err != nil {
		t.Fatal(err)
	}
	r, err := a.Open("deaf", "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 64<<20)
	col := xfertest.NewRecorder()
	const wait = 500 * time.Millisecond
	deadline := time.Now().Add(wait)
	var tasks []*xfer.Task
	for i := 0; i < 16; i++ {
		tk := mkTask(col, xfer.OpWrite, local, uint64(i)<<20, r, uint64(i)<<20, 1<<20)
		tk.Deadline = deadline
		tasks = append(tasks, tk)
	}
	start := time.Now()
	if k, err := a.Submit(tasks); k != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v", k, err)
	}
	for _, d := range col.Next(t, len(tasks), 10*time.Second) {
		if !errors.Is(d.Err, ErrConnLost) && !errors.Is(d.Err, xfer.ErrTimeout) {
			t.Fatalf("task to a peer that reads nothing ended with %v", d.Err)
		}
	}
	if el := time.Since(start); el > wait+stallGrace+5*time.Second {
		t.Fatalf("tasks ended %v after Submit; deadline %v, stall grace %v", el, wait, stallGrace)
	}
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs with a writer that waited for room")
	}
	close(stop)
	fake.close()
	testutil.Eventually(t, 2*time.Second, func() bool { return openFDs(t) <= before },
		"%v descriptors open after close, %d before", testutil.Lazy(func() int { return openFDs(t) }), before)
}

// TestLargeFrameAllocations: a 1 MiB WRITE, which its connection's writer
// sends, allocates nothing in the steady state either.
func TestLargeFrameAllocations(t *testing.T) {
	nodes := cluster(t, []string{"a", "b"}, 4<<20, Config{ConnsPerPeer: 1})
	a := nodes[0]
	r, err := a.Open("b", "seg", RightRead|RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 4<<20)
	cc := make(xfertest.Chan, 1)
	tk := &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, Length: 1 << 20}, Local: local, Target: r}
	tk.SetCompleter(cc)
	one := []*xfer.Task{tk}
	for i := 0; i < 20; i++ {
		a.Submit(one)
		<-cc
	}
	allocs := testing.AllocsPerRun(100, func() {
		a.Submit(one)
		if d := <-cc; d.Err != nil {
			t.Fatal(d.Err)
		}
	})
	limit := 0.0
	if invariants.RaceEnabled {
		limit = 4
	}
	if allocs > limit {
		t.Errorf("%.1f allocations per 1 MiB request", allocs)
	}
}

// reuser is a Completer that takes a task's memory back the moment the task
// ends, as its caller may: it overwrites mem with 0xAA (at once, in one
// copy), then records the end.
type reuser struct {
	*xfertest.Recorder
	mem, marks []byte
}

func (r reuser) TaskDone(t *xfer.Task, n uint64, err error) {
	copy(r.mem, r.marks)
	r.Recorder.TaskDone(t, n, err)
}

// TestEarlyWriteAnswerWaitsForTheWrite: a peer may answer a WRITE as soon
// as it has read the header, while this node's writer is still sending the
// payload from the task's memory. The answer is taken (it is no error),
// but the task ends only once the writer is done with its memory: the
// bytes the peer reads are the task's, though the caller overwrites them
// the moment the task ends.
func TestEarlyWriteAnswerWaitsForTheWrite(t *testing.T) {
	key := []byte("k")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	const size = 16 << 20 // far more than the sockets' buffers: the writer waits for the peer
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf, ConnsPerPeer: 1, SliceSize: size})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hsKey, tokKey := deriveKey(key, "tensorcast handshake v1"), deriveKey(key, "tensorcast token v1")
	goRead := make(chan struct{})
	read := make(chan []byte, 1)
	go func() {
		defer close(read)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		h, meta, _, err := readFrame(c)
		if err != nil || h.typ != tHello {
			return
		}
		hs := hello{id: "f", epoch: 0xfeed, addr: ln.Addr().String(), maxFrame: 64 << 20, window: 1 << 40}
		metaS := hs.append(nil)
		reply := append(append([]byte(nil), metaS...), handshakeMAC(hsKey, labelServer, meta, metaS)...)
		_ = writeRaw(c, &header{typ: tHelloReply, metaLen: uint16(len(reply))}, reply)
		if h, _, _, err = readFrame(c); err != nil || h.typ != tAuth {
			return
		}
		_ = writeRaw(c, &header{typ: tAuthOK}, nil)
		if h, meta, _, err = readFrame(c); err != nil || h.typ != tOpenReq {
			return
		}
		tok := (&token{access: Access{Name: string(meta)}, rights: Rights(h.flags), expiry: time.Now().Add(time.Hour).UnixNano(),
			issuer: "f", epoch: 0xfeed}).sign(tokKey)
		_ = writeRaw(c, &header{typ: tOpenResp, id: h.id, arg: size, metaLen: uint16(len(tok))}, tok)
		var hb [hdrLen]byte
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			return
		}
		if h, err = decodeHeader(hb[:], limits{maxPayload: size, maxMeta: 8192}); err != nil || h.typ != tWriteReq {
			return
		}
		if _, err := io.ReadFull(c, make([]byte, h.metaLen)); err != nil {
			return
		}
		_ = writeRaw(c, &header{typ: tWriteResp, id: h.id, n: h.n}, nil) // before the payload
		<-goRead
		p := make([]byte, h.n)
		if _, err := io.ReadFull(c, p); err == nil {
			read <- p
		}
	}()
	if err := a.Directory().Update(dirPeer("f", ln.Addr().String())); err != nil {
		t.Fatal(err)
	}
	r, err := a.Open("f", "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, size)
	for i := range local.Bytes() {
		local.Bytes()[i] = 0x55
	}
	col := reuser{Recorder: xfertest.NewRecorder(), mem: local.Bytes(), marks: bytes.Repeat([]byte{0xAA}, size)}
	if k, err := a.Submit([]*xfer.Task{mkTask(col, xfer.OpWrite, local, 0, r, 0, size)}); k != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", k, err)
	}
	// The answer is in once the slice's credit is back.
	p := a.peer("f", false)
	inflight := func() int64 {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.inflight
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return inflight() == 0 },
		"the early answer taken (in flight: %v)", testutil.Lazy(inflight))
	close(goRead)
	got := <-read
	if got == nil {
		t.Fatal("the peer did not get the payload")
	}
	if i := bytes.IndexByte(got, 0xAA); i >= 0 {
		t.Fatalf("the peer read memory the task had given back: byte %d of %d written after the task ended", i, size)
	}
	if d := col.Next(t, 1, 5*time.Second)[0]; d.Err != nil || d.N != size {
		t.Fatalf("write answered early: moved %d, %v; want %d, nil", d.N, d.Err, size)
	}
}
