package testutil

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

// tests stands for testing.M: it runs f as the package's tests.
type tests struct {
	f   func() int
	ran bool
}

func (m *tests) Run() int {
	m.ran = true
	return m.f()
}

func pass() int { return 0 }

// TestMainFailsWhenFDsCannotBeListed: a leak check that cannot look fails
// loudly, before the tests or after them, instead of passing.
func TestMainFailsWhenFDsCannotBeListed(t *testing.T) {
	noProc := func() (FDs, error) { return nil, errors.New("open /proc/self/fd: no such file or directory") }
	var out strings.Builder
	m := &tests{f: pass}
	if code := run(m, &out, listFDs(noProc)); code == 0 {
		t.Fatal("passed without a descriptor listing")
	}
	if m.ran {
		t.Error("ran the tests with no leak check possible")
	}
	if !strings.Contains(out.String(), "no leak check can run") || !strings.Contains(out.String(), "/proc/self/fd") {
		t.Errorf("message %q does not say what is missing", out.String())
	}

	// The listing works before the tests and not after.
	calls := 0
	once := func() (FDs, error) {
		if calls++; calls == 1 {
			return OpenFDs()
		}
		return noProc()
	}
	out.Reset()
	if code := run(&tests{f: pass}, &out, listFDs(once)); code == 0 || !strings.Contains(out.String(), "cannot run") {
		t.Fatalf("exit %d, %q: passed without the listing after the tests", code, out.String())
	}
}

// TestMainFindsLeaks: a descriptor or a goroutine the tests leave behind
// fails the run, named in the message; a clean run passes, and a failed
// run keeps its own code.
func TestMainFindsLeaks(t *testing.T) {
	var out strings.Builder
	if code := run(&tests{f: pass}, &out); code != 0 {
		t.Fatalf("a clean run exits %d: %s", code, out.String())
	}
	if code := run(&tests{f: func() int { return 3 }}, &out); code != 3 {
		t.Fatalf("a failed run exits %d, want the tests' 3", code)
	}

	var r, w *os.File
	code := run(&tests{f: func() int {
		var err error
		r, w, err = os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		return 0
	}}, &out)
	r.Close()
	w.Close()
	if code == 0 || !strings.Contains(out.String(), "descriptor leak") || !strings.Contains(out.String(), "pipe:") {
		t.Fatalf("exit %d, %q: a leaked pipe went unseen", code, out.String())
	}

	// A descriptor closed just after the tests returned (by a server's
	// event loop, say) is on its way out, not leaked: the listing after the
	// tests sees it once, and the check waits for it.
	out.Reset()
	lists := 0
	late := func() (FDs, error) {
		fds, err := OpenFDs()
		if lists++; lists == 2 {
			r.Close()
			w.Close()
		}
		return fds, err
	}
	code = run(&tests{f: func() int {
		var err error
		r, w, err = os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		return 0
	}}, &out, listFDs(late))
	if code != 0 || lists < 3 {
		t.Fatalf("exit %d after %d listings, %q: a pipe closed just after the tests counted as leaked", code, lists, out.String())
	}

	out.Reset()
	stop := make(chan struct{})
	code = run(&tests{f: func() int {
		go func() { <-stop }()
		return 0
	}}, &out)
	close(stop)
	if code == 0 || !strings.Contains(out.String(), "goroutine leak") {
		t.Fatalf("exit %d, %q: a leaked goroutine went unseen", code, out.String())
	}
}

// TestMainChild: with its variable set, the binary plays the child's part
// and runs no test; Warm runs before the baseline, After after the tests.
func TestMainChild(t *testing.T) {
	t.Setenv("TESTUTIL_MAIN_CHILD", "side-b")
	got := ""
	m := &tests{f: pass}
	code := run(m, new(strings.Builder), Child("TESTUTIL_MAIN_UNSET", func(string) int { return 9 }),
		Child("TESTUTIL_MAIN_CHILD", func(v string) int { got = v; return 7 }))
	if code != 7 || got != "side-b" || m.ran {
		t.Fatalf("exit %d, child saw %q, tests ran %v: want the child's 7 with side-b and no tests", code, got, m.ran)
	}

	var order []string
	var kept *os.File
	code = run(&tests{f: func() int { order = append(order, "tests"); return 0 }}, new(strings.Builder),
		Warm(func() {
			order = append(order, "warm")
			var err error
			if kept, err = os.Open(os.Args[0]); err != nil {
				t.Fatal(err)
			}
		}),
		After(func() { order = append(order, "after") }))
	kept.Close()
	if code != 0 || strings.Join(order, ",") != "warm,tests,after" {
		t.Fatalf("exit %d, order %v: want warm, tests, after, and what Warm opened not counted as a leak", code, order)
	}
}
