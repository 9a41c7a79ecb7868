//go:build linux

// Package fdstore plays systemd's side of the notify protocol for a daemon
// that tests and the soak start themselves: a notify socket that keeps the
// descriptors the daemon sends with FDSTORE=1 and FDNAME= (a file it holds
// already only once, as systemd does), drops those FDSTOREREMOVE=1 names,
// and tells when the daemon says READY=1. The next start gets what is kept
// from fd 3 on, with LISTEN_FDS and LISTEN_FDNAMES (Env).
package fdstore

import (
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Store is one notify socket and the descriptors kept from it. Its reader
// goroutine runs until Close, which also closes every descriptor kept.
type Store struct {
	conn *net.UnixConn
	path string
	done chan struct{}

	// mu guards the fields below, and the kept descriptors while Start's
	// function runs.
	mu    sync.Mutex
	names []string
	files []*os.File
	ready chan struct{} // closed at the next READY=1
}

// Listen opens the notify socket at path (replacing a stale one).
func Listen(path string) (*Store, error) {
	_ = os.Remove(path)
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	s := &Store{conn: c, path: path, done: make(chan struct{}), ready: make(chan struct{})}
	go s.read()
	return s, nil
}

// Path is the notify socket's path (NOTIFY_SOCKET).
func (s *Store) Path() string { return s.path }

func (s *Store) read() {
	defer close(s.done)
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(16*4))
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		var fds []int
		if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, cm := range cms {
				if r, err := unix.ParseUnixRights(&cm); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		fields := map[string]string{}
		for _, line := range strings.Split(string(buf[:n]), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				fields[k] = v
			}
		}
		s.mu.Lock()
		switch {
		case fields["FDSTORE"] == "1":
			for _, fd := range fds {
				s.keep(fields["FDNAME"], fd)
			}
			fds = nil
		case fields["FDSTOREREMOVE"] == "1":
			for i := 0; i < len(s.names); i++ {
				if s.names[i] == fields["FDNAME"] {
					s.files[i].Close()
					s.names = append(s.names[:i], s.names[i+1:]...)
					s.files = append(s.files[:i], s.files[i+1:]...)
					i--
				}
			}
		}
		if fields["READY"] == "1" {
			close(s.ready)
			s.ready = make(chan struct{})
		}
		s.mu.Unlock()
		for _, fd := range fds {
			unix.Close(fd) // descriptors with a message that stores none
		}
	}
}

// keep stores fd under name unless a kept descriptor is the same file.
// s.mu is held.
func (s *Store) keep(name string, fd int) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return
	}
	for _, f := range s.files {
		var o unix.Stat_t
		if unix.Fstat(int(f.Fd()), &o) == nil && o.Dev == st.Dev && o.Ino == st.Ino {
			unix.Close(fd)
			return
		}
	}
	s.names = append(s.names, name)
	s.files = append(s.files, os.NewFile(uintptr(fd), name))
}

// NextReady is closed when the daemon next says READY=1: take it before
// starting the daemon.
func (s *Store) NextReady() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}

// Start runs start with the kept descriptors and their names, holding
// them meanwhile: what the running daemon asks to drop (FDSTOREREMOVE) is
// closed only after start returns, when the next daemon has its copies.
func (s *Store) Start(start func(files []*os.File, names []string) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return start(append([]*os.File(nil), s.files...), append([]string(nil), s.names...))
}

// Env is the environment a start with files (the kept ones, or more before
// them) and names gets: NOTIFY_SOCKET, FDSTORE (FileDescriptorStoreMax=),
// and LISTEN_FDS and LISTEN_FDNAMES when there are files. LISTEN_PID is
// the daemon's own, set by whoever execs it.
func (s *Store) Env(files []*os.File, names []string) []string {
	env := []string{"NOTIFY_SOCKET=" + s.path, "FDSTORE=16"}
	if len(files) > 0 {
		env = append(env, "LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
	}
	return env
}

// Names are the names kept now.
func (s *Store) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.names...)
}

// Close closes the socket, waits for the reader, and closes what is kept.
func (s *Store) Close() {
	s.conn.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		f.Close()
	}
	s.names, s.files = nil, nil
}
