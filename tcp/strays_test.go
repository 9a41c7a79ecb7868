package tcp

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestCloseStrays: what closeStrays closes is exactly the connections
// accepted on the listener's address that nobody tracks (here, one
// accepted by hand and dropped): not the listener, not the dialing side
// of the same connection, not a connection accepted on another listener.
func TestCloseStrays(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	accept := func(l net.Listener) (dialed net.Conn, accepted int) {
		t.Helper()
		d, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		a, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		// A bare descriptor of its own, as gnet's is: no *os.File whose
		// finalizer would close its number again.
		f, err := a.(*net.TCPConn).File()
		if err != nil {
			t.Fatal(err)
		}
		fd, err := syscall.Dup(int(f.Fd()))
		f.Close()
		a.Close()
		if err != nil {
			t.Fatal(err)
		}
		return d, fd
	}
	d1, stray := accept(ln)
	defer d1.Close()
	d2, kept := accept(other)
	defer d2.Close()
	defer syscall.Close(kept)

	n := &Node{bound: ln.Addr().String()}
	if c := n.closeStrays(); c != 1 {
		t.Fatalf("closed %d sockets, want the one stray", c)
	}
	// The stray's descriptor is closed: using it fails with EBADF.
	if _, err := syscall.Getsockname(stray); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("the stray is still open: getsockname says %v", err)
	}
	for _, c := range []net.Conn{d1, d2} {
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatalf("a dialed connection was closed: %v", err)
		}
	}
	if _, err := syscall.Getsockname(kept); err != nil {
		t.Fatalf("the other listener's connection was closed: %v", err)
	}
	if c := n.closeStrays(); c != 0 {
		t.Fatalf("a second sweep closed %d", c)
	}
}
