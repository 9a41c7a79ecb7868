package xfer_test

import (
	"log/slog"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// The engine's tests drive it with the shared doubles of package xfertest
// (its Config.Lie and Disown make the transports that break the count
// contract on purpose); what is here is theirs alone: the fixture.

// says is a Config.Lie: Submit reports count(n) and err, where n is what
// it took.
func says(count func(n int) int, err error) func(int, error) (int, error) {
	return func(n int, _ error) (int, error) { return count(n), err }
}

// syncTr is a transport that ends every task inside Submit with its full
// length.
func syncTr() *xfertest.Transport { return xfertest.New(xfertest.Config{Name: "sync", Inline: true}) }

// takeAtMost is the Config.Limit that takes k tasks per Submit, none when
// k is 0.
func takeAtMost(k int) int {
	if k == 0 {
		return -1
	}
	return k
}

// fixture is an engine over a registry of two counting segments.
type fixture struct {
	e    *xfer.Engine
	reg  *xfer.Registry
	a, b *xfertest.Segment
	opts xfer.SubmitOptions
}

// fixtureOpt changes what newFixture makes.
type fixtureOpt func(*fixtureCfg)

type fixtureCfg struct {
	log  *slog.Logger
	size int
}

// withLog makes the engine log to log.
func withLog(log *slog.Logger) fixtureOpt { return func(c *fixtureCfg) { c.log = log } }

// withSize makes both segments size bytes (64 KiB otherwise).
func withSize(size int) fixtureOpt { return func(c *fixtureCfg) { c.size = size } }

func newFixture(t testing.TB, cfg xfer.Config, r xfer.Router, opts ...fixtureOpt) *fixture {
	t.Helper()
	fc := fixtureCfg{size: 1 << 16}
	for _, o := range opts {
		o(&fc)
	}
	f := &fixture{e: xfer.NewEngine(cfg, r, fc.log), reg: xfer.NewRegistry(),
		a: xfertest.NewSegment(1, fc.size), b: xfertest.NewSegment(2, fc.size)}
	for _, s := range []*xfertest.Segment{f.a, f.b} {
		if err := f.reg.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	f.opts = xfer.SubmitOptions{Resolver: f.reg}
	return f
}

// reqs returns n valid write requests of 64 bytes each from a to b.
func (f *fixture) reqs(n int) []xfer.Request {
	rs := make([]xfer.Request, n)
	for i := range rs {
		rs[i] = xfer.Request{Op: xfer.OpWrite, Local: 1, LocalOffset: uint64(i * 64), Target: 2, TargetOffset: uint64(i * 64), Length: 64}
	}
	return rs
}

func (f *fixture) status(t testing.TB, id xfer.BatchID, i int) xfer.TaskStatus {
	t.Helper()
	st, err := f.e.Status(id, i)
	if err != nil {
		t.Fatalf("Status(%d): %v", i, err)
	}
	return st
}
