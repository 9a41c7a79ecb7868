package tcp

import (
	"bytes"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// writePieces writes b in pieces of at most piece bytes, one write each, so
// the reader sees a frame arrive in parts.
func writePieces(c net.Conn, b []byte, piece int) error {
	for len(b) > 0 {
		k := min(piece, len(b))
		if _, err := c.Write(b[:k]); err != nil {
			return err
		}
		b = b[k:]
	}
	return nil
}

// TestPayloadStraightFromTheSocket: payloads larger than the event loop's
// read buffer are read from the socket straight into their destination
// (readDirect), on both sides. A READ answer and a WRITE payload that
// arrive in odd-sized pieces land whole and in order with the frames that
// follow them; a payload cut short by a close fails only its request and
// releases the segment it was going to.
func TestPayloadStraightFromTheSocket(t *testing.T) {
	key := []byte("cluster-secret")
	const size = 3 << 20 // several read buffers' worth
	src := make([]byte, size)
	fill(rand.New(rand.NewPCG(7, 7)), src)

	t.Run("read answers in pieces", func(t *testing.T) {
		kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
		a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf, ConnsPerPeer: 1, SliceSize: 4 << 20})
		// The fake owner answers each READ from src: the header with a few
		// bytes, then pieces of 1000 bytes, then the rest in one write
		// (more than the loop's read buffer holds).
		fake := newFakePeer(t, "owner", key, func(c net.Conn, h header, _ []byte) bool {
			b := make([]byte, hdrLen, hdrLen+int(h.n))
			putHeader(b, &header{typ: tReadResp, id: h.id, n: h.n})
			b = append(b, src[h.arg:h.arg+uint64(h.n)]...)
			return writePieces(c, b[:hdrLen+10], 7) == nil && writePieces(c, b[hdrLen+10:hdrLen+10000], 1000) == nil &&
				writePieces(c, b[hdrLen+10000:], len(b)) == nil
		})
		if err := a.Directory().Update(dirPeer("owner", fake.ln.Addr().String())); err != nil {
			t.Fatal(err)
		}
		r, err := a.Open("owner", "seg", RightRead)
		if err != nil {
			t.Fatal(err)
		}
		local := xfertest.NewSegment(1, size)
		col := xfertest.NewRecorder()
		// Three reads on one connection: their answers follow each other
		// on the wire.
		third := uint64(size / 3)
		tasks := []*xfer.Task{
			mkTask(col, xfer.OpRead, local, 0, r, 0, third),
			mkTask(col, xfer.OpRead, local, third, r, third, third),
			mkTask(col, xfer.OpRead, local, 2*third, r, 2*third, size-2*third),
		}
		for _, d := range submitWait(t, a.Node, col, tasks, 10*time.Second) {
			if d.Err != nil || d.N != d.Task.Req.Length {
				t.Fatalf("read: n=%d err=%v", d.N, d.Err)
			}
		}
		if !bytes.Equal(local.Bytes(), src) {
			t.Fatal("the bytes read differ from the owner's")
		}
	})

	t.Run("write payload in pieces, then one cut short", func(t *testing.T) {
		kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
		b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf, SliceSize: 4 << 20})
		seg := xfertest.NewSegment(5, size)
		b.exp.add("seg", seg)
		tok := (&token{name: "seg", rights: RightWrite, expiry: time.Now().Add(time.Hour).UnixNano(), issuer: "b", epoch: b.Epoch()}).
			sign(deriveKey(key, "tensorcast token v1"))
		frame := func(id uint64, off, n int) []byte {
			f := make([]byte, hdrLen, hdrLen+len(tok)+n)
			putHeader(f, &header{typ: tWriteReq, id: id, arg: uint64(off), n: uint32(n), metaLen: uint16(len(tok))})
			return append(append(f, tok...), src[off:off+n]...)
		}
		c := rawClient(t, b, key, "writer")
		// Two big writes back to back, in pieces that straddle the frame
		// boundary, then a small one.
		wire := append(frame(1, 0, size/2), frame(2, size/2, size/2-4096)...)
		wire = append(wire, frame(3, size-4096, 4096)...)
		go writePieces(c, wire, 77777)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for id := uint64(1); id <= 3; id++ {
			h, _, _, err := readFrame(c)
			if err != nil {
				t.Fatal(err)
			}
			if h.typ != tWriteResp || h.id != id || h.status != stOK {
				t.Fatalf("answer %d: %+v", id, h)
			}
		}
		// The release of the segment after the last payload orders its
		// bytes before this read (for the race detector too).
		testutil.Eventually(t, 5*time.Second, func() bool { return seg.Refs() == 0 },
			"segment refs %v after the writes", testutil.Lazy(seg.Refs))
		if !bytes.Equal(seg.Bytes(), src) {
			t.Fatal("the segment differs from what was written")
		}

		// A payload cut short: the connection goes, the segment is released,
		// and the node serves on.
		c2 := rawClient(t, b, key, "quitter")
		cut := frame(4, 0, size/2)
		if err := writePieces(c2, cut[:len(cut)/2], 65536); err != nil {
			t.Fatal(err)
		}
		// The node holds the segment while the payload is due; only once it
		// does is a zero count below the release rather than the state from
		// before the frame (and only then are the writes below ordered
		// after this connection's).
		testutil.Eventually(t, 5*time.Second, func() bool { return seg.Refs() == 1 },
			"segment refs %v while a payload is due", testutil.Lazy(seg.Refs))
		c2.Close()
		testutil.Eventually(t, 5*time.Second, func() bool { return seg.Refs() == 0 },
			"segment refs %v after a payload cut short", testutil.Lazy(seg.Refs))
		for id := uint64(5); id <= 6; id++ {
			_ = writePieces(c, frame(id, 0, 1<<20), 1<<20)
			h, _, _, err := readFrame(c)
			if err != nil || h.typ != tWriteResp || h.status != stOK {
				t.Fatalf("write after the cut: %+v %v", h, err)
			}
		}
		testutil.Eventually(t, 5*time.Second, func() bool { return seg.Refs() == 0 },
			"segment refs %v after the later writes", testutil.Lazy(seg.Refs))
		if !bytes.Equal(seg.Bytes(), src) {
			t.Fatal("the segment differs after the later writes")
		}
	})
}
