//go:build linux

package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestHandoffKeepsPeerPort is the rolling update of a DaemonSet with peers
// and maxSurge: d1 serves peers on a fixed port, d2 reads and writes d1's
// export all along, and a new d1 takes over (store_handoff = on). The
// listening socket is the same one before and after (the kernel's inode
// of the one socket listening on the port), never closed: a dialer that
// keeps connecting to the port through the hand-off is never refused, and
// every connection it makes is served by one daemon or the other. d2's requests before the hand-off succeed; those that
// meet it end once each, with a status code; and d2, without a restart,
// reaches the new d1 on the same address once the export is made again
// there, with the bytes it writes read back.
func TestHandoffKeepsPeerPort(t *testing.T) {
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast hand-off peers key")
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	handoff := func(c *Config) {
		c.StoreHandoff = "on"
		c.DrainTimeout = Duration(time.Second)
	}
	d1 := startPeerWith(t, "d1", key, addr, handoff, dialsIn("d2"))
	d2 := startPeerWith(t, "d2", key, "", nil, PeerConfig{ID: "d1", Addr: addr})
	inode := listeningInodes(t, port)
	if len(inode) != 1 {
		t.Fatalf("sockets listening on port %d before the hand-off: %v, want one", port, inode)
	}

	const blk = 64 << 10
	export := func(d *peerDaemon) {
		c := d.dial(t, "exporter")
		pi, ok := c.Pool()
		if !ok {
			t.Fatal("exporter has no pool mapping")
		}
		offs, err := c.AllocBlocks(nil, 1, blk)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ExportSegment("kv", pi.Segment, offs[0], blk, client.RightRead|client.RightWrite); err != nil {
			t.Fatal(err)
		}
	}
	export(d1)
	l := startPeerLoad(t, d2.dial(t, "peer-load"), blk)
	defer l.stop()
	l.waitOK(t, 20, "before the hand-off")

	// Dial the port all through the hand-off: the kernel completes each
	// connection while the socket listens, in its backlog if no daemon
	// accepts, and the daemon that accepts it next serves it; a closed
	// port would refuse it.
	var dialed, refused atomic.Int64
	var dialErr atomic.Value
	stopDial := make(chan struct{})
	dialDone := make(chan struct{})
	go func() {
		// At most dialsOut connections wait to be served at once: the
		// next dial waits for one of them to be, so while no daemon
		// accepts they wait in the socket's backlog, which they never
		// fill.
		const dialsOut = 8
		slots := make(chan struct{}, dialsOut)
		var wg sync.WaitGroup
		defer func() { wg.Wait(); close(dialDone) }()
		for {
			select {
			case <-stopDial:
				return
			case slots <- struct{}{}:
			}
			wg.Add(1)
			go func() {
				defer func() { <-slots; wg.Done() }()
				if err := dialServed(addr); err == nil {
					dialed.Add(1)
				} else {
					refused.Add(1)
					dialErr.Store(err.Error())
				}
			}()
		}
	}()

	oldEpoch := d1.d.peers.Node().Epoch()
	okBefore := l.oks.Load()
	// A request in flight as the hand-off begins meets it as surely as
	// one issued during it (read in this order, a request issued or ended
	// between the two loads is not counted as in flight).
	issuedBefore := l.issued.Load()
	inFlightBefore := issuedBefore - l.ended.Load()
	// New blocks until the old daemon handed over: its drain, its parts
	// closing, the lock.
	d1b := startPeerWith(t, "d1", key, addr, func(c *Config) {
		handoff(c)
		c.Socket, c.DataDir = d1.cfg.Socket, d1.cfg.DataDir
	}, dialsIn("d2"))
	issuedDuring := l.issued.Load() - issuedBefore
	close(stopDial)
	<-dialDone

	if n := refused.Load(); n > 0 {
		t.Errorf("%d of %d connections to the peer port failed through the hand-off (last: %v)", n, n+dialed.Load(), dialErr.Load())
	}
	if dialed.Load() < 10 {
		t.Errorf("only %d connections to the peer port were made through the hand-off", dialed.Load())
	}
	if after := listeningInodes(t, port); len(after) != 1 || after[0] != inode[0] {
		t.Errorf("sockets listening on port %d after the hand-off: %v, before: %v (the listener was bound anew)", port, after, inode)
	}
	if !strings.Contains(d1.log.String(), "hand-off: peer listener handed over") {
		t.Errorf("the old daemon did not hand its peer listener over:\n%s", lastLines(d1.log.String(), 20))
	}
	if !strings.Contains(d1b.log.String(), "serving peers on the listener the old daemon passed") {
		t.Errorf("the new daemon did not serve on the passed listener:\n%s", lastLines(d1b.log.String(), 20))
	}
	if d1b.d.PeerAddr() != addr {
		t.Errorf("the new daemon's peer address is %s, want %s", d1b.d.PeerAddr(), addr)
	}
	if issuedDuring == 0 && inFlightBefore <= 0 {
		t.Errorf("d2 had no request in flight as the hand-off began and issued none while it ran")
	}

	// The export comes back with its exporter: d2 reaches it again.
	export(d1b)
	okAfter := l.oks.Load()
	l.waitOK(t, okAfter+20, "after the hand-off")
	l.stop()
	if err := l.err(); err != nil {
		t.Fatal(err)
	}
	codes := l.codeCounts()
	t.Logf("d2's requests: %d ok before the hand-off, %d in flight as it began, %d issued during it, %d ok in all; failed with codes %v; %d connections to the port, none refused",
		okBefore, inFlightBefore, issuedDuring, l.oks.Load(), codes, dialed.Load())
	if len(codes) == 0 {
		t.Errorf("no request of d2 failed across the hand-off: the test did not meet it")
	}
	// d2 reconnected: its session with d1 is the new daemon's (its epoch).
	var seen bool
	for _, s := range d2.d.peers.Node().Peers() {
		if s.ID != "d1" {
			continue
		}
		seen = true
		if !s.Connected || s.Epoch != d1b.d.peers.Node().Epoch() || s.Epoch == oldEpoch {
			t.Errorf("d2's session with d1: %+v; want connected to the new d1 (epoch %#x; the old one's %#x)", s, d1b.d.peers.Node().Epoch(), oldEpoch)
		}
	}
	if !seen {
		t.Error("d2 lists no peer d1")
	}
}

// dialServed connects to the peer port at addr and waits until whatever
// listens there serves the connection: it sends a frame header the daemon
// refuses (bad magic), and the daemon then closes the connection. A
// connection made while no daemon accepts waits in the socket's backlog
// until one does, so each dial waits for the listener rather than for a
// pause, and a backlog never fills up with dials nobody takes. It fails
// when the dial fails or nothing serves the connection within 10s.
func dialServed(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write(make([]byte, 32)); err != nil {
		return fmt.Errorf("write to the peer port: %w", err)
	}
	var b [64]byte
	for {
		if _, err := c.Read(b[:]); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("a connection to the peer port was not served: %w", err)
			}
			return nil // closed by the daemon (EOF or reset): served
		}
	}
}

// peerLoad writes a pattern into d1/kv from d2 and reads it back, one
// request at a time, until stopped; it opens the remote segment again
// after a failure. Each request must end once: nil, or a status code.
type peerLoad struct {
	c           *client.Client
	blk         uint64
	oks, issued atomic.Int64
	ended       atomic.Int64 // requests whose Transfer returned
	stopCh      chan struct{}
	done        chan struct{}
	once        sync.Once
	// mu guards codes and bad.
	mu    sync.Mutex
	codes map[string]int
	bad   error
}

func startPeerLoad(t *testing.T, c *client.Client, blk uint64) *peerLoad {
	l := &peerLoad{c: c, blk: blk, stopCh: make(chan struct{}), done: make(chan struct{}), codes: map[string]int{}}
	pi, ok := c.Pool()
	if !ok {
		t.Fatal("d2's client has no pool mapping")
	}
	offs, err := c.AllocBlocks(nil, 2, blk)
	if err != nil {
		t.Fatal(err)
	}
	go l.run(pi.Segment, offs, c.PoolBytes())
	return l
}

func (l *peerLoad) run(pool xfer.SegmentID, offs []uint64, mem []byte) {
	defer close(l.done)
	var remote client.RemoteSegment
	open := false
	res := make([]error, 1)
	for i := 0; ; i++ {
		select {
		case <-l.stopCh:
			return
		default:
		}
		if !open {
			// Until d1/kv can be opened again (the new daemon up, its
			// export back), or the load stops.
			stopped := false
			if !testutil.Poll(30*time.Second, func() bool {
				var err error
				if remote, err = l.c.OpenRemote("d1/kv", client.RightRead|client.RightWrite); err == nil {
					return true
				}
				select {
				case <-l.stopCh:
					stopped = true
					return true
				default:
				}
				return !l.note(err)
			}) {
				l.fail(errors.New("d1/kv could not be opened again within 30s"))
				return
			}
			if stopped || l.err() != nil {
				return
			}
			open = true
		}
		src, dst := mem[offs[0]:offs[0]+l.blk], mem[offs[1]:offs[1]+l.blk]
		for j := range src {
			src[j] = byte(i + j/4096)
		}
		clear(dst)
		ok := true
		for _, r := range []xfer.Request{
			{Op: xfer.OpWrite, Local: pool, LocalOffset: offs[0], Target: remote.ID, Length: l.blk},
			{Op: xfer.OpRead, Local: pool, LocalOffset: offs[1], Target: remote.ID, Length: l.blk},
		} {
			l.issued.Add(1)
			sum, err := l.c.Transfer([]xfer.Request{r}, 10*time.Second, res)
			l.ended.Add(1)
			if err != nil {
				l.fail(fmt.Errorf("%v: the call to d2 failed: %w", r.Op, err))
				return
			}
			if sum.Completed+sum.Failed != 1 {
				l.fail(fmt.Errorf("%v: summary %+v for one request: not ended once", r.Op, sum))
				return
			}
			if res[0] != nil {
				if !l.note(res[0]) {
					return
				}
				ok = false
				break
			}
		}
		if !ok {
			open = false
			continue
		}
		if !bytes.Equal(src, dst) {
			l.fail(fmt.Errorf("round %d: the bytes read back from d1/kv are not those written", i))
			return
		}
		l.oks.Add(1)
	}
}

// note counts a failed request's code; false (and the load fails) when
// the failure has none.
func (l *peerLoad) note(err error) bool {
	var se *client.StatusError
	if !errors.As(err, &se) {
		l.fail(fmt.Errorf("a request failed without a status code: %w", err))
		return false
	}
	l.mu.Lock()
	l.codes[se.Code.String()]++
	l.mu.Unlock()
	return true
}

func (l *peerLoad) fail(err error) {
	l.mu.Lock()
	if l.bad == nil {
		l.bad = err
	}
	l.mu.Unlock()
}

func (l *peerLoad) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bad
}

func (l *peerLoad) codeCounts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for k, v := range l.codes {
		out[k] = v
	}
	return out
}

// waitOK waits until n round trips succeeded in all.
func (l *peerLoad) waitOK(t *testing.T, n int64, what string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() bool {
		if err := l.err(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return l.oks.Load() >= n
	}, "%s: %d round trips from d2 to d1/kv", what, n)
}

func (l *peerLoad) stop() {
	l.once.Do(func() {
		close(l.stopCh)
		<-l.done
	})
}

// freePort returns a tcp port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// listeningInodes returns the inodes of the sockets listening on port, as
// /proc/net/tcp lists them (state 0A).
func listeningInodes(t *testing.T, port int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(":%04X", port)
	var out []string
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) >= 10 && strings.HasSuffix(f[1], want) && f[3] == "0A" {
			out = append(out, f[9])
		}
	}
	return out
}

// TestTakeListeners: the new daemon's side of the listeners message takes
// one peer listener of its own network namespace and drops (closing it,
// and saying why) one of another namespace, a message that is not one, or
// none at all.
func TestTakeListeners(t *testing.T) {
	for _, tc := range []struct {
		name, msg string
		fds       int
		take      bool
		why       string
	}{
		{"own namespace", "listeners peer-listen " + netNamespace(), 1, true, ""},
		{"no peer plane", "listeners", 0, false, ""},
		{"another namespace", "listeners peer-listen net:[1]", 1, false, "network namespace net:[1]"},
		{"two descriptors", "listeners peer-listen " + netNamespace(), 2, false, "with 2 descriptors"},
		{"not listeners", "state pool-default", 1, false, "not its listeners"},
		{"nothing sent", "", 0, false, "no peer listener taken over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			fd := dupListener(t, ln)
			old, asker := seqpacketPair(t)
			var fds []int
			for range tc.fds {
				fds = append(fds, fd)
			}
			if tc.msg != "" {
				var rights []byte
				if len(fds) > 0 {
					rights = syscall.UnixRights(fds...)
				}
				if _, _, err := old.WriteMsgUnix([]byte(tc.msg+"\n"), rights, nil); err != nil {
					t.Fatal(err)
				}
			}
			syscall.Close(fd)
			old.Close()
			log := &lockedBuffer{}
			d := &Daemon{log: slog.New(slog.NewTextHandler(log, nil))}
			in := &inheritedFDs{}
			before := openFDs(t)
			d.takeListeners(asker, in)
			asker.Close()
			got, taken := in.take(peerListenFD)
			if taken != tc.take {
				t.Fatalf("peer listener taken %v, want %v; log:\n%s", taken, tc.take, log)
			}
			if taken {
				if inode := socketInode(t, got); inode != socketInodeOf(t, ln) {
					t.Errorf("the listener taken is socket %s, the one sent %s", inode, socketInodeOf(t, ln))
				}
				syscall.Close(got)
			}
			if tc.why != "" && !strings.Contains(log.String(), tc.why) {
				t.Errorf("log does not say %q:\n%s", tc.why, log)
			}
			// Whatever was dropped is closed: no descriptor more than
			// before but the taken one, closed above.
			if after := openFDs(t); after > before-1 {
				t.Errorf("%d descriptors open after, %d before (the asker's end among them): a dropped listener leaked", after, before)
			}
		})
	}
}

// seqpacketPair returns the two ends of a SOCK_SEQPACKET socket pair.
func seqpacketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cs [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "seqpacket")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c.(*net.UnixConn)
	}
	return cs[0], cs[1]
}

// socketInode is the socket fd refers to ("socket:[inode]").
func socketInode(t *testing.T, fd int) string {
	t.Helper()
	s, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dupListener returns a duplicate of ln's descriptor.
func dupListener(t *testing.T, ln net.Listener) int {
	t.Helper()
	fd, err := -1, error(nil)
	withListenerFD(t, ln, func(s int) { fd, err = syscall.Dup(s) })
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// socketInodeOf is the socket ln listens on ("socket:[inode]").
func socketInodeOf(t *testing.T, ln net.Listener) string {
	t.Helper()
	var s string
	withListenerFD(t, ln, func(fd int) { s = socketInode(t, fd) })
	return s
}

// withListenerFD runs f with ln's descriptor.
func withListenerFD(t *testing.T, ln net.Listener, f func(fd int)) {
	t.Helper()
	raw, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Control(func(fd uintptr) { f(int(fd)) }); err != nil {
		t.Fatal(err)
	}
}
