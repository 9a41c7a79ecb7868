package main

import (
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// fdStore plays systemd's file descriptor store for a daemon of the soak
// (the hitless-restart fault): a notify socket that keeps what the daemon
// sends with FDSTORE=1 and FDNAME= (a file it holds already only once, as
// systemd does), drops what FDSTOREREMOVE=1 names, and hands all of it to
// the next start from fd 3 on (LISTEN_FDS, LISTEN_FDNAMES, and LISTEN_PID
// set to the daemon's own pid by the shell that execs it).
//
// Its reader goroutine runs until close, which closes the socket (ending
// the reader) and every descriptor kept.
type fdStore struct {
	conn *net.UnixConn
	path string
	done chan struct{}

	// mu guards the fields below.
	mu    sync.Mutex
	names []string
	files []*os.File
	ready chan struct{} // closed at the next READY=1
}

func newFDStore(path string) (*fdStore, error) {
	_ = os.Remove(path)
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	s := &fdStore{conn: c, path: path, done: make(chan struct{}), ready: make(chan struct{})}
	go s.read()
	return s, nil
}

func (s *fdStore) read() {
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
			unix.Close(fd)
		}
	}
}

// keep stores fd under name unless a stored descriptor is the same file.
// s.mu is held.
func (s *fdStore) keep(name string, fd int) {
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

// passed is what the next start gets: the files (from fd 3 on), the
// environment that names them, and the channel its READY=1 closes.
func (s *fdStore) passed() ([]*os.File, []string, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	env := []string{"NOTIFY_SOCKET=" + s.path, "FDSTORE=16"}
	if len(s.files) > 0 {
		env = append(env, "LISTEN_FDS="+strconv.Itoa(len(s.files)), "LISTEN_FDNAMES="+strings.Join(s.names, ":"))
	}
	return append([]*os.File(nil), s.files...), env, s.ready
}

// stored are the names kept now.
func (s *fdStore) stored() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.names...)
}

func (s *fdStore) close() {
	s.conn.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		f.Close()
	}
	s.files, s.names = nil, nil
}
