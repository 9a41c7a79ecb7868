//go:build linux

package fdstore

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// send is a daemon's sd_notify with descriptors attached.
func send(t *testing.T, path, state string, fds ...int) {
	t.Helper()
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(s)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(s, []byte(state), oob, &unix.SockaddrUnix{Name: path}, 0); err != nil {
		t.Fatal(err)
	}
}

// TestStoreKeepsDropsAndReady: FDSTORE=1 keeps a descriptor under its name
// (the same file twice only once), FDSTOREREMOVE=1 drops it, READY=1
// closes NextReady, and Start and Env hand what is kept to the next start.
func TestStoreKeepsDropsAndReady(t *testing.T) {
	s, err := Listen(filepath.Join(t.TempDir(), "notify.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pool, err := unix.MemfdCreate("pool", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pool)
	journal, err := unix.MemfdCreate("journal", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(journal)

	ready := s.NextReady()
	send(t, s.Path(), "FDSTORE=1\nFDNAME=pool-default", pool)
	send(t, s.Path(), "FDSTORE=1\nFDNAME=pool-again", pool)
	send(t, s.Path(), "FDSTORE=1\nFDNAME=l1journal-default", journal)
	send(t, s.Path(), "READY=1")
	<-ready // the socket is read in order: every message before is taken
	if got := s.Names(); !slices.Equal(got, []string{"pool-default", "l1journal-default"}) {
		t.Fatalf("kept %v, want the pool once and the journal", got)
	}
	if s.NextReady() == ready {
		t.Fatal("NextReady after READY=1 is the channel already closed")
	}

	err = s.Start(func(files []*os.File, names []string) error {
		env := s.Env(files, names)
		want := []string{"NOTIFY_SOCKET=" + s.Path(), "FDSTORE=16", "LISTEN_FDS=2", "LISTEN_FDNAMES=pool-default:l1journal-default"}
		if len(files) != 2 || !slices.Equal(env, want) {
			t.Fatalf("start gets %d files and %v, want 2 and %v", len(files), env, want)
		}
		var a, b unix.Stat_t
		if unix.Fstat(int(files[0].Fd()), &a) != nil || unix.Fstat(pool, &b) != nil || a.Ino != b.Ino {
			t.Fatal("the first file handed on is not the pool")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	ready = s.NextReady()
	send(t, s.Path(), "FDSTOREREMOVE=1\nFDNAME=pool-default")
	send(t, s.Path(), "READY=1")
	<-ready
	if got := s.Names(); !slices.Equal(got, []string{"l1journal-default"}) {
		t.Fatalf("after FDSTOREREMOVE kept %v, want the journal alone", got)
	}
	if env := s.Env(nil, nil); len(env) != 2 {
		t.Fatalf("a start with nothing kept gets %v", env)
	}
}
