package testutil

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Main is the TestMain of every package's tests:
//
//	func TestMain(m *testing.M) { testutil.Main(m) }
//
// It lists this process's descriptors, runs the tests, and when they pass
// checks that they leaked no descriptor (sockets, memfds, rings, epolls,
// files) and no goroutine. It exits non-zero, saying why, when a test
// failed, when something leaked, and when the descriptors cannot be
// listed: a leak check that cannot look fails rather than passes. A
// package's own needs are options: a child process its tests start
// (Child), what lives for the process (Warm), a clean-up after the tests
// (After).
func Main(m *testing.M, opts ...Option) {
	os.Exit(run(m, os.Stderr, opts...))
}

// An Option adds a package's own need to Main.
type Option func(*mainConfig)

// Child makes a copy of the test binary that a test starts with env set
// to a non-empty value play its part: Main runs child with that value
// instead of the tests and exits with what it returns.
func Child(env string, child func(value string) int) Option {
	return func(c *mainConfig) { c.children = append(c.children, childRole{env, child}) }
}

// Warm runs f before the descriptor baseline is taken: f opens what lives
// for the rest of the process (a cached probe's ring, say), which is then
// not counted as the tests' leak.
func Warm(f func()) Option {
	return func(c *mainConfig) { c.warm = append(c.warm, f) }
}

// After runs f once the tests have run, before the leak checks: it removes
// what the tests shared for the life of the binary (a daemon built once).
func After(f func()) Option {
	return func(c *mainConfig) { c.after = append(c.after, f) }
}

// listFDs is how Main lists the descriptors; tests of Main replace it.
func listFDs(f func() (FDs, error)) Option {
	return func(c *mainConfig) { c.list = f }
}

type mainConfig struct {
	children []childRole
	warm     []func()
	after    []func()
	list     func() (FDs, error)
}

type childRole struct {
	env string
	run func(string) int
}

// processGoroutines are the goroutines that live as long as the process
// and are no test's leak: gnet's package-level worker pool (tcp's event
// loops, and so the peer plane, the daemon and what runs it) starts its
// two housekeeping goroutines at program init.
var processGoroutines = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
	goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock"),
}

// GoroutineLeak reports the goroutines still running beyond those opts
// ignore and those that live for the process, or nil when there are none.
// It waits a little for goroutines on their way out.
func GoroutineLeak(opts ...goleak.Option) error {
	return goleak.Find(append(opts, processGoroutines...)...)
}

// fdGrace is how long the descriptor check waits for descriptors on their
// way out: a connection whose close a stopped server's event loop or a
// transport's reader performs just after the test returned. goleak waits
// the same way for goroutines.
const fdGrace = 2 * time.Second

// leakedFDs lists the descriptors open beyond before, waiting up to
// fdGrace for the list to empty; it returns what is still open then.
func leakedFDs(before FDs, list func() (FDs, error)) ([]string, error) {
	deadline := time.Now().Add(fdGrace)
	for {
		now, err := list()
		if err != nil {
			return nil, err
		}
		leaked := before.Leaked(now)
		if len(leaked) == 0 || time.Now().After(deadline) {
			return leaked, nil
		}
		time.Sleep(20 * time.Millisecond) // polling the kernel's table: no event says a descriptor closed
	}
}

// run is Main without the exit; m is what runs the tests.
func run(m interface{ Run() int }, stderr io.Writer, opts ...Option) int {
	c := mainConfig{list: OpenFDs}
	for _, o := range opts {
		o(&c)
	}
	for _, ch := range c.children {
		if v := os.Getenv(ch.env); v != "" {
			return ch.run(v)
		}
	}
	for _, f := range c.warm {
		f()
	}
	WarmFDs()
	before, err := c.list()
	if err != nil {
		fmt.Fprintf(stderr, "testutil.Main: no leak check can run: %v\n", err)
		return 2
	}
	code := m.Run()
	for _, f := range c.after {
		f()
	}
	if code != 0 {
		return code
	}
	leaked, err := leakedFDs(before, c.list)
	if err != nil {
		fmt.Fprintf(stderr, "testutil.Main: the descriptor leak check cannot run: %v\n", err)
		return 2
	}
	if len(leaked) > 0 {
		fmt.Fprintf(stderr, "descriptor leak (rings show as anon_inode:[io_uring], epolls as anon_inode:[eventpoll]):\n  %s\n",
			strings.Join(leaked, "\n  "))
		code = 1
	}
	if err := GoroutineLeak(); err != nil {
		fmt.Fprintf(stderr, "goroutine leak: %v\n", err)
		code = 1
	}
	return code
}
