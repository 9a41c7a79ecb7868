package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/daemon/config"
	"github.com/tensorcast/tensorcast/internal/ratelog"
)

// The hand-off between two daemons, without systemd (store_handoff = on).
// Where systemd's file descriptor store keeps the pools and L1 journals
// across a restart (restart.go), a rolling update that starts the new
// daemon while the old one runs (a Kubernetes DaemonSet with maxSurge 1 and
// maxUnavailable 0, both pods mounting the socket's host directory) has the
// new one take them from the old one:
//
//  1. Every daemon holds an exclusive flock on SOCKET.lock from start-up
//     until it has closed everything that can write the pools, the L1
//     journals and the L2 files (or until it exits). A daemon that finds
//     the lock held and store_handoff = on dials SOCKET.handoff (a
//     SOCK_SEQPACKET socket, mode 0600; the old daemon also checks the
//     peer's credentials: its own uid or root, anyone else is refused and
//     logged; the new daemon requires the same of what answers, and does
//     not start otherwise) and asks for a hand-off.
//  2. The old daemon answers "accepted", then shuts down as on SIGTERM
//     (the bounded drain of drain.go: no new work, drain_timeout for the
//     work in flight, every part closed), which closes and unlinks the
//     control socket. It duplicates each tenant's pool memfd and L1
//     journal memfd, unmaps them (and checks that no part of it still
//     maps a pool), and sends the duplicates with SCM_RIGHTS under the
//     names of systemd's store (pool-TENANT, l1journal-TENANT): the same
//     state a restart through systemd passes. Then it releases the lock
//     and waits for SIGTERM, holding nothing (a container that exits is
//     restarted in its pod, and would ask for the daemon back). The new
//     daemon waits for the state as long as the old one says it drains
//     (with closeGrace and handoffMargin), but never longer than the
//     longest drain_timeout a config accepts: a longer one is clamped, and
//     said in the log.
//  3. The new daemon waits for the lock, so that it serves only once the
//     old one can no longer write: then it adopts the pools and journals
//     as after a systemd restart (every record's value checked against
//     its crc32c; a value being written has no record and is dropped) and
//     binds the control socket. Clients reconnect; their pool mappings
//     stay the pool.
//
// The peer port goes across too. When it accepts, the old daemon
// duplicates its peer listener's descriptor (before the drain, which
// closes the listener), and after the state it sends a second message,
// "listeners peer-listen NETNS", with that duplicate and the name of its
// network namespace: a listener of another namespace (a pod with a host
// port rather than the node's network) is dropped, since nothing reaches
// it once that pod is gone. The socket is never
// closed: what peers dial while neither daemon accepts (from the old
// one's peer node stopping to the new one's starting) waits in its
// backlog, and the new daemon serves the same socket (tcp.Config.Listener)
// when it listens on the same address (peer_listen; port 0 takes any),
// else it closes it and binds peer_listen, saying so. Peers' sessions with
// the old daemon end with its drain: their requests on them fail
// (ErrConnLost), and they dial again, into the backlog. RDMA has no
// listener of its own (its connection data ride the tcp handshake). A
// daemon that predates the second message never sends it: the new one
// sees the connection end and binds the port itself; one that predates it
// reading it leaves it unread, and the descriptor is closed with the
// connection.
//
// A daemon that does not answer (gone, stopping, or without store_handoff)
// or hands over no state (store off, store_keep_l1 = off, a part that did
// not let go of a pool) makes the new daemon wait for the lock and start
// cold, saying why in the log. A refusal (credentials, a hand-off already
// under way) fails the start: the old daemon keeps the socket.

const (
	lockSuffix    = ".lock"
	handoffSuffix = ".handoff"
	handoffHello  = "tensorcast-handoff 1"
	// handoffReplyTimeout bounds each step of the exchange but the drain.
	handoffReplyTimeout = 5 * time.Second
	// handoffMargin is added to the old daemon's drain_timeout and grace
	// for the state to come, and to the new one's for the lock.
	handoffMargin = 10 * time.Second
	// lockPoll is how often a daemon waiting for the lock tries it.
	lockPoll = 10 * time.Millisecond
	// maxHandoffMsg bounds a hand-off message.
	maxHandoffMsg = 64 << 10
	// maxHandoffText bounds what of the other daemon's texts goes to a
	// log or an error.
	maxHandoffText = 200
	// handoffLogEvery rate-limits the log of refused requests.
	handoffLogEvery = 10 * time.Second
	// peerListenFD names the peer listener in the listeners message.
	peerListenFD = "peer-listen"
)

// handoffState is the old daemon's side of a hand-off under way.
type handoffState struct {
	ln      *net.UnixListener
	reqs    chan *net.UnixConn // the accepted request (one)
	done    chan struct{}      // the accept loop ended
	refused *ratelog.Log
	// conn is the new daemon's connection once Run took the request.
	conn *net.UnixConn
	// peerFD is a duplicate of the peer listener, taken by Run with the
	// request and sent after the state (-1: none).
	peerFD int
	// handedOver is set once the state went (or "nostate" did).
	handedOver bool
	// mu guards answering, the connection being answered, which closing
	// the listener closes too (a slow asker does not hold the shutdown).
	mu        sync.Mutex
	answering *net.UnixConn
	closed    bool
}

// acquireLock takes SOCKET.lock. When another daemon holds it, with
// store_handoff = on it asks that daemon to hand over, and returns what
// it passed (an empty set when nothing usable came, said in the log); with
// store_handoff = off the start fails.
func (d *Daemon) acquireLock() (*inheritedFDs, error) {
	sock := d.cfg.Socket
	path := sock + lockSuffix
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("the socket's directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the daemon's lock %s: %w", path, err)
	}
	d.lockFile = f
	got, err := tryLock(f)
	if err != nil {
		return nil, fmt.Errorf("the daemon's lock %s: %w", path, err)
	}
	handoff := d.cfg.StoreHandoff == "on"
	if got {
		if handoff {
			d.log.Info("hand-off: no daemon runs on the socket: starting cold", "socket", sock)
		}
		return &inheritedFDs{}, nil
	}
	if !handoff {
		return nil, fmt.Errorf("%w: %s: another daemon holds %s (store_handoff = on takes over from it)", control.ErrAddrInUse, sock, path)
	}
	in, wait, why, err := d.takeOver()
	if err != nil {
		return nil, err
	}
	if why != "" {
		d.log.Warn("hand-off: starting cold once the old daemon is gone", "why", why, "wait", wait.String())
	}
	deadline := time.Now().Add(wait)
	for {
		if got, err = tryLock(f); err != nil || got {
			break
		}
		if !time.Now().Before(deadline) {
			err = fmt.Errorf("%w: %s: the daemon there still holds %s %v after it was asked to hand over: not starting while it may write the pools or the L2 files",
				control.ErrAddrInUse, sock, path, wait)
			break
		}
		time.Sleep(lockPoll)
	}
	if err != nil {
		in.closeAll()
		return nil, err
	}
	if len(in.fds) > 0 {
		d.log.Info("hand-off: the old daemon handed over and let go of the pools; adopting them", "descriptors", in.names)
	}
	return in, nil
}

// tryLock takes f's exclusive flock if it is free.
func tryLock(f *os.File) (bool, error) {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EWOULDBLOCK):
			return false, nil
		case errors.Is(err, unix.EINTR):
			continue
		}
		return false, os.NewSyscallError("flock", err)
	}
}

// releaseLock lets the next daemon start: called once nothing of this one
// can write the pools, journals or L2 files, or at a failed start.
func (d *Daemon) releaseLock() {
	if d.lockFile != nil {
		d.lockFile.Close()
		d.lockFile = nil
	}
}

// takeOver asks the daemon on the socket for its state. It returns the
// descriptors passed, how long to wait for that daemon's lock, and why no
// state came ("" when it did); an error when the daemon refused.
func (d *Daemon) takeOver() (*inheritedFDs, time.Duration, string, error) {
	in := &inheritedFDs{}
	path := d.cfg.Socket + handoffSuffix
	ownWait := time.Duration(d.cfg.DrainTimeout) + closeGrace + handoffMargin
	c, err := net.DialTimeout("unixpacket", path, handoffReplyTimeout)
	if err != nil {
		return in, ownWait, fmt.Sprintf("no hand-off offered at %s (%v): the daemon there is stopping, or runs with store_handoff = off", path, err), nil
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	// What answers must be a daemon of this uid or root, as the old
	// daemon requires of the asker: a process of another uid that took
	// the socket's name (in a socket directory others may write) would
	// keep mapping the memfds it passed, and so read every value this
	// daemon then keeps in them.
	u, err := peerCred(conn)
	if err != nil {
		return nil, 0, "", fmt.Errorf("%w: %s: the credentials of what answers there: %v", control.ErrAddrInUse, path, err)
	}
	if own := uint32(os.Getuid()); u.Uid != own && u.Uid != 0 {
		return nil, 0, "", fmt.Errorf("%w: %s is served by pid %d of uid %d, neither this daemon's uid (%d) nor root: taking nothing from it",
			control.ErrAddrInUse, path, u.Pid, u.Uid, own)
	}
	conn.SetDeadline(time.Now().Add(handoffReplyTimeout))
	if _, err := conn.Write([]byte(handoffHello + "\n")); err != nil {
		return in, ownWait, fmt.Sprintf("asking %s: %v", path, err), nil
	}
	buf := make([]byte, maxHandoffMsg)
	n, err := conn.Read(buf)
	if err != nil {
		return in, ownWait, fmt.Sprintf("no answer from %s: %v", path, err), nil
	}
	verb, arg, _ := strings.Cut(strings.TrimSuffix(string(buf[:n]), "\n"), " ")
	switch verb {
	case "accepted":
	case "stopping":
		return in, ownWait, "the daemon there is stopping: " + clip(arg), nil
	case "refused":
		return nil, 0, "", fmt.Errorf("%w: %s: the daemon there refused the hand-off: %s", control.ErrAddrInUse, d.cfg.Socket, clip(arg))
	default:
		return in, ownWait, fmt.Sprintf("%s answered %q, not a hand-off", path, string(buf[:min(n, 80)])), nil
	}
	drain, clamped, err := handoffDrain(arg)
	if err != nil {
		return in, ownWait, fmt.Sprintf("%s answered %q", path, clip("accepted "+arg)), nil
	}
	if clamped {
		d.log.Warn("hand-off: the old daemon states a drain longer than any drain_timeout may be: waiting for its state no longer than the longest",
			"stated_ms", clip(arg), "bound", drain.String())
	}
	d.log.Info("hand-off: the old daemon accepted and drains", "drain_timeout", drain.String())
	conn.SetDeadline(time.Now().Add(drain + closeGrace + handoffMargin))
	oob := make([]byte, unix.CmsgSpace(4*maxListenFDs))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	fds := parseRights(oob[:oobn])
	wait := handoffReplyTimeout + handoffMargin // the old daemon has closed everything: the lock is next
	cold := func(w time.Duration, why string) (*inheritedFDs, time.Duration, string, error) {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		return in, w, why, nil
	}
	if err != nil {
		return cold(ownWait, fmt.Sprintf("the old daemon sent no state: %v", err))
	}
	// The listeners come next, whatever the state was.
	d.takeListeners(conn, in)
	switch {
	case flags&unix.MSG_CTRUNC != 0:
		return cold(wait, "the old daemon's state came with more descriptors than a hand-off has (truncated): dropped")
	case flags&unix.MSG_TRUNC != 0:
		return cold(wait, fmt.Sprintf("the old daemon's state is longer than a hand-off message (%d bytes; truncated): dropped", maxHandoffMsg))
	}
	verb, arg, _ = strings.Cut(strings.TrimSuffix(string(buf[:n]), "\n"), " ")
	switch {
	case verb == "nostate":
		return cold(wait, "the old daemon handed over no state: "+clip(arg))
	case verb != "state":
		return cold(wait, fmt.Sprintf("the old daemon sent %q, not its state", clip(verb)))
	}
	names := strings.Split(arg, ":")
	if len(names) != len(fds) {
		return cold(wait, fmt.Sprintf("the old daemon's state names %d descriptors and has %d: dropped", len(names), len(fds)))
	}
	seen := make(map[string]bool, len(names))
	for _, name := range names {
		switch {
		case !stored(name):
			return cold(wait, fmt.Sprintf("the old daemon's state has a descriptor named %q: dropped", clip(name)))
		case seen[name]:
			return cold(wait, fmt.Sprintf("the old daemon's state names %q twice: dropped", clip(name)))
		}
		seen[name] = true
	}
	// Only this daemon's tenants' descriptors are taken; another name (a
	// tenant the new config removed, or one no tenant can have) is closed
	// here. Left with the others, it would be closed as unused and its
	// name sent to systemd (FDSTOREREMOVE): a name with a newline would
	// add lines of the old daemon's choosing to that message, and a name
	// given twice would remove the descriptor adopted under it.
	own := make(map[string]bool)
	for _, t := range d.cfg.TenantList() {
		own[poolFDPrefix+t.Name], own[journalFDPrefix+t.Name] = true, true
	}
	for i, fd := range fds {
		if !own[names[i]] {
			syscall.Close(fd)
			d.log.Warn("hand-off: the old daemon passed a descriptor of no tenant of this daemon: closed", "name", clip(names[i]))
			continue
		}
		unix.CloseOnExec(fd)
		in.fds, in.names, in.taken, in.handed = append(in.fds, fd), append(in.names, names[i]), append(in.taken, false), append(in.handed, true)
	}
	return in, wait, "", nil
}

// clip bounds a text the other daemon sent, for a log or an error.
func clip(s string) string {
	if len(s) <= maxHandoffText {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:maxHandoffText], len(s))
}

// handoffDrain reads the drain the old daemon states as it accepts (its
// drain_timeout in milliseconds), for which the new daemon waits for its
// state (with closeGrace and handoffMargin). The old daemon is believed up
// to the longest drain_timeout a config accepts, so that a rolling update
// that shortens drain_timeout still waits for the old daemon's longer one;
// more than that (even past a Duration's range) is clamped to it, and
// clamped says so. What is not a number of milliseconds is an error.
func handoffDrain(arg string) (drain time.Duration, clamped bool, err error) {
	limit := config.MaxDrainTimeout
	ms, err := strconv.ParseUint(arg, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return limit, true, nil
	case err != nil:
		return 0, false, err
	case ms > uint64(limit/time.Millisecond):
		return limit, true, nil
	}
	return time.Duration(ms) * time.Millisecond, false, nil
}

// takeListeners reads the old daemon's listeners message, sent right
// after its state, and adds the peer listener to in (checked when it is
// adopted, in handedPeerListener). A daemon that sends none ends the connection
// once it released the lock; what is not one peer listener is dropped
// and said in the log.
func (d *Daemon) takeListeners(conn *net.UnixConn, in *inheritedFDs) {
	buf := make([]byte, 256)
	oob := make([]byte, unix.CmsgSpace(4*maxListenFDs))
	conn.SetReadDeadline(time.Now().Add(handoffReplyTimeout + handoffMargin))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	fds := parseRights(oob[:oobn])
	drop := func(why string) {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		d.log.Warn("hand-off: no peer listener taken over: the peer port is bound anew, and peers dialing until then are refused", "why", why)
	}
	if err != nil {
		drop(fmt.Sprintf("the old daemon sent no listeners (%v): it predates passing them", err))
		return
	}
	verb, arg, _ := strings.Cut(strings.TrimSuffix(string(buf[:n]), "\n"), " ")
	name, ns, _ := strings.Cut(arg, " ")
	switch here := netNamespace(); {
	case verb != "listeners":
		drop(fmt.Sprintf("the old daemon sent %q, not its listeners", string(buf[:min(n, 80)])))
	case flags&unix.MSG_CTRUNC != 0:
		drop("its listeners came with more descriptors than a hand-off has (truncated)")
	case arg == "" && len(fds) == 0:
		// It has no peer plane.
	case name != peerListenFD || ns == "" || len(fds) != 1:
		drop(fmt.Sprintf("the old daemon's listeners name %q with %d descriptors, not one %s", arg, len(fds), peerListenFD))
	case ns != here:
		// A pod of its own network (a host port): the socket would stay
		// in that namespace, which nothing reaches once the pod is gone.
		drop(fmt.Sprintf("the old daemon's listener is in network namespace %s, this daemon runs in %s", ns, here))
	default:
		unix.CloseOnExec(fds[0])
		in.fds, in.names, in.taken, in.handed = append(in.fds, fds[0]), append(in.names, peerListenFD), append(in.taken, false), append(in.handed, true)
	}
}

// netNamespace names this process's network namespace ("net:[inode]"),
// or says why it cannot (then no two daemons' names are equal).
func netNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return fmt.Sprintf("unknown(pid %d: %v)", os.Getpid(), err)
	}
	return ns
}

// handedPeerListener returns the peer listener a hand-off passed, when it
// is a listening TCP socket on peer_listen's address (port 0: any); nil
// when none came, or it was not fit (closed, and said in the log: the
// peer port is then bound anew).
func (d *Daemon) handedPeerListener(in *inheritedFDs) *net.TCPListener {
	fd, ok := in.take(peerListenFD)
	if !ok {
		return nil
	}
	ln, err := tcpListenerOf(fd)
	if err == nil {
		err = sameListenAddr(ln.Addr().(*net.TCPAddr), d.cfg.PeerListen)
	}
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		d.log.Warn("hand-off: the peer listener the old daemon passed is not used: binding peer_listen anew", "peer_listen", d.cfg.PeerListen, "why", err)
		return nil
	}
	d.log.Info("hand-off: serving peers on the listener the old daemon passed (same socket, no new bind)", "addr", ln.Addr().String())
	return ln
}

// tcpListenerOf makes a listener of fd, which it closes: it must be a
// listening TCP socket.
func tcpListenerOf(fd int) (*net.TCPListener, error) {
	listening, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("getsockopt SO_ACCEPTCONN", err)
	}
	f := os.NewFile(uintptr(fd), peerListenFD)
	l, err := net.FileListener(f)
	f.Close() // FileListener holds its own duplicate
	if err != nil {
		return nil, err
	}
	tl, ok := l.(*net.TCPListener)
	switch {
	case !ok:
		network := l.Addr().Network()
		l.Close()
		return nil, fmt.Errorf("a %s socket, not tcp", network)
	case listening != 1:
		l.Close()
		return nil, errors.New("a tcp socket that does not listen")
	}
	return tl, nil
}

// sameListenAddr is nil when addr is what listen (host:port) binds: the
// same port, or any with port 0, and the same address (an empty host
// and 0.0.0.0 are the unspecified address, as :: is).
func sameListenAddr(addr *net.TCPAddr, listen string) error {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return err
	}
	if p, err := net.LookupPort("tcp", port); err != nil || (p != 0 && p != addr.Port) {
		return fmt.Errorf("it listens on port %d, peer_listen %q", addr.Port, listen)
	}
	ip := net.ParseIP(host)
	if host == "" {
		ip = net.IPv4zero
	}
	if ip == nil {
		ips, err := net.LookupIP(host)
		if err != nil || len(ips) == 0 {
			return fmt.Errorf("peer_listen %q: %v", listen, err)
		}
		ip = ips[0]
		for _, c := range ips {
			if c.Equal(addr.IP) {
				ip = c
			}
		}
	}
	if ip.Equal(addr.IP) || (ip.IsUnspecified() && addr.IP.IsUnspecified()) {
		return nil
	}
	return fmt.Errorf("it listens on %s, peer_listen %q", addr, listen)
}

// parseRights returns the descriptors of SCM_RIGHTS messages in oob.
func parseRights(oob []byte) []int {
	var fds []int
	cms, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for _, cm := range cms {
		if r, err := unix.ParseUnixRights(&cm); err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}

// listenHandoff opens SOCKET.handoff for the next daemon (store_handoff =
// on). This daemon holds the lock, so a file there is a dead daemon's.
func (d *Daemon) listenHandoff() error {
	if d.cfg.StoreHandoff != "on" {
		return nil
	}
	path := d.cfg.Socket + handoffSuffix
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return fmt.Errorf("%w: %s exists and is not a socket", ErrConfig, path)
		}
		if err := os.Remove(path); err != nil {
			return err
		}
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("hand-off socket %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return err
	}
	d.hand = &handoffState{ln: ln, reqs: make(chan *net.UnixConn, 1), done: make(chan struct{}), peerFD: -1,
		refused: ratelog.New(d.log, slog.LevelWarn, "hand-off refused", handoffLogEvery)}
	return nil
}

// serveHandoff answers hand-off requests until the listener is closed: the
// first good one goes to Run, later ones are told the daemon is stopping.
func (d *Daemon) serveHandoff() {
	h := d.hand
	defer close(h.done)
	taken := false
	for {
		c, err := h.ln.AcceptUnix()
		if err != nil {
			return
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			c.Close()
			return
		}
		h.answering = c
		h.mu.Unlock()
		ok := d.answerHandoff(c, taken)
		h.mu.Lock()
		h.answering = nil
		h.mu.Unlock()
		if ok {
			taken = true
			h.reqs <- c
			continue
		}
		c.Close()
	}
}

// answerHandoff checks a request and answers it; true when accepted.
func (d *Daemon) answerHandoff(c *net.UnixConn, taken bool) bool {
	h := d.hand
	u, err := peerCred(c)
	if err != nil {
		h.refused.Event(slog.String("err", err.Error()))
		return false
	}
	reply := func(s string) { c.Write([]byte(s + "\n")) }
	c.SetDeadline(time.Now().Add(handoffReplyTimeout))
	// The request is read first, whoever asks (a socket closed with its
	// request unread would reset the refusal before the asker reads it).
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if own := uint32(os.Getuid()); u.Uid != own && u.Uid != 0 {
		why := fmt.Sprintf("uid %d is neither this daemon's (%d) nor root", u.Uid, own)
		reply("refused " + why)
		h.refused.Event(slog.String("why", why), slog.Int("pid", int(u.Pid)), slog.Int("uid", int(u.Uid)))
		return false
	}
	if err != nil || strings.TrimSuffix(string(buf[:n]), "\n") != handoffHello {
		reply("refused not a hand-off request")
		h.refused.Event(slog.String("why", "not a hand-off request"), slog.Int("pid", int(u.Pid)))
		return false
	}
	if taken || d.stopping.Load() {
		reply("stopping a shutdown or another hand-off is under way")
		return false
	}
	reply("accepted " + strconv.FormatInt(time.Duration(d.cfg.DrainTimeout).Milliseconds(), 10))
	c.SetDeadline(time.Time{})
	d.log.Info("hand-off: a new daemon asks for the pools; draining to hand them over", "pid", u.Pid, "uid", u.Uid)
	return true
}

// peerCred is the credentials of c's peer (SO_PEERCRED: those it had
// when it connected, or listened).
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var u *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { u, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, os.NewSyscallError("getsockopt SO_PEERCRED", cerr)
	}
	return u, nil
}

// closeHandoffListener stops taking requests (shutdown, or a failed start).
func (d *Daemon) closeHandoffListener() {
	if d.hand == nil || d.hand.ln == nil {
		return
	}
	h := d.hand
	h.mu.Lock()
	h.closed = true
	if h.answering != nil {
		h.answering.Close()
	}
	h.mu.Unlock()
	h.ln.Close()
	if d.started.Load() {
		<-h.done
	}
	h.refused.Stop()
	h.ln = nil
	// A request accepted as the shutdown began is not served: its asker
	// sees the connection end and starts cold once this daemon is gone.
	select {
	case c := <-h.reqs:
		if c != h.conn {
			c.Close()
		}
	default:
	}
}

// handOver ends the shutdown of a daemon asked to hand over: the pools and
// journals are duplicated, unmapped and closed here, and the duplicates go
// to the new daemon only when no part of this one maps a pool any more and
// the store closed cleanly. It runs after every other part closed.
func (d *Daemon) handOver() {
	h := d.hand
	var fds []int
	var names []string
	why := ""
	if !d.keep.on {
		why = "L1 is not kept (store off or store_keep_l1 = off)"
	}
	if why == "" && d.storeCloseErr != nil {
		why = "the store did not close cleanly: " + d.storeCloseErr.Error()
	}
	if why == "" {
		for i, t := range d.cfg.TenantList() {
			for _, src := range [2]struct {
				name string
				fd   int
			}{{poolFDPrefix + t.Name, d.pools[i].Fd()}, {journalFDPrefix + t.Name, d.keep.journals[i].Fd()}} {
				fd, err := unix.FcntlInt(uintptr(src.fd), unix.F_DUPFD_CLOEXEC, 0)
				if err != nil {
					why = fmt.Sprintf("duplicating %s: %v", src.name, err)
					break
				}
				fds, names = append(fds, fd), append(names, src.name)
			}
		}
	}
	d.closeJournals()
	d.closePools()
	for i, p := range d.pools {
		if why == "" && !p.Unmapped() {
			why = fmt.Sprintf("the pool of tenant %q is still mapped by a part of this daemon that did not let go of it", d.names[i])
		}
	}
	msg := "state " + strings.Join(names, ":") + "\n"
	if why != "" {
		msg = "nostate " + why + "\n"
		for _, fd := range fds {
			syscall.Close(fd)
		}
		fds = nil
	}
	var rights []byte
	if len(fds) > 0 {
		rights = syscall.UnixRights(fds...)
	}
	h.conn.SetWriteDeadline(time.Now().Add(handoffReplyTimeout))
	_, _, err := h.conn.WriteMsgUnix([]byte(msg), rights, nil)
	for _, fd := range fds {
		syscall.Close(fd)
	}
	h.handedOver = true
	if err == nil {
		d.sendListeners()
	}
	switch {
	case err != nil:
		d.log.Error("hand-off: sending the state failed: the new daemon starts cold", "err", err)
	case why != "":
		d.log.Warn("hand-off: no state handed over: the new daemon starts cold", "why", why)
	default:
		d.log.Info("hand-off: pools and L1 journals handed over", "descriptors", names)
	}
}

// holdPeerListener duplicates the peer listener for the new daemon, as the
// hand-off starts: the drain closes the node's own descriptor, and the
// duplicate keeps the socket, and what peers dial meanwhile, open.
func (d *Daemon) holdPeerListener() {
	if d.peers == nil {
		return
	}
	fd, err := d.peers.Node().DupListener()
	if err != nil {
		d.log.Warn("hand-off: cannot keep the peer listener for the new daemon: it binds the peer port anew, and peers dialing until then are refused",
			"err", err)
		return
	}
	d.hand.peerFD = fd
}

// sendListeners sends the new daemon the peer listener held since the
// hand-off started ("listeners" and none without a peer plane), and
// closes this daemon's duplicate.
func (d *Daemon) sendListeners() {
	h := d.hand
	msg, rights := "listeners\n", []byte(nil)
	if h.peerFD >= 0 {
		msg, rights = "listeners "+peerListenFD+" "+netNamespace()+"\n", syscall.UnixRights(h.peerFD)
	}
	_, _, err := h.conn.WriteMsgUnix([]byte(msg), rights, nil)
	d.closePeerListener()
	switch {
	case err != nil:
		d.log.Error("hand-off: sending the peer listener failed: the new daemon binds the peer port anew", "err", err)
	case rights != nil:
		d.log.Info("hand-off: peer listener handed over: peers dialing now wait in its backlog for the new daemon")
	}
}

// closePeerListener closes the duplicate of the peer listener, if held.
func (d *Daemon) closePeerListener() {
	if d.hand != nil && d.hand.peerFD >= 0 {
		syscall.Close(d.hand.peerFD)
		d.hand.peerFD = -1
	}
}

// closeHandoff closes the connection to the new daemon, after the lock.
func (d *Daemon) closeHandoff() {
	d.closePeerListener()
	if d.hand != nil && d.hand.conn != nil {
		d.hand.conn.Close()
	}
}
