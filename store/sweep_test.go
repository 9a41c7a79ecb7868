package store

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// failWrites makes the writes fail picks fail (errInjected), and counts
// in zeroes the header zeroings the device is asked to make (failed ones
// included). Writes of a value failing keep a value in L1 only: its
// writeback retries come due as the test moves the clock for the sweep.
func (e *testEnv) failWrites(zeroes *atomic.Int64, fail func(*xfer.Task) bool) {
	e.tr.Update(func(c *xfertest.Config) {
		c.OnSubmit = func(ts []*xfer.Task) {
			for _, task := range ts {
				if isZeroWrite(task) {
					zeroes.Add(1)
				}
			}
		}
		c.Err = func(task *xfer.Task) error {
			if fail(task) {
				return errInjected
			}
			return nil
		}
	})
}

// sweepEnded waits until the sweep has zeroed ok ghosts and failed fail
// times in all, and no pass is in flight (the next one armed).
func (e *testEnv) sweepEnded(what string, ok, fail uint64) {
	e.t.Helper()
	e.waitFor(what, func() bool {
		st := e.s.Stats()
		t := e.s.l2
		t.mu.Lock()
		idle := t.sweepRunning == 0
		t.mu.Unlock()
		return st.GhostsZeroed == ok && st.GhostZeroFailures == fail && idle
	})
}

// sweepDue is how long after now the next pass of the sweep is due, and
// whether one is.
func (e *testEnv) sweepDue() (time.Duration, bool) {
	t := e.s.l2
	t.mu.Lock()
	defer t.mu.Unlock()
	return time.Duration(t.sweepAt - e.s.now()), t.sweepArmed
}

// TestGhostSweepZeroesAGhostOnceTheDeviceWrites: a ghost (an older
// block's header that outlived a failed zeroing) under a key whose newer
// value is in L1 only was zeroed only by the key's next invalidation.
// Until then its slot stayed out of use, and a restart without the L1
// journal brought the key back with its older value. The maintenance
// loop now zeroes it on its own: a first try while the device still
// fails leaves it a ghost, the next one after the device writes again
// zeroes it, and its slot is in use again.
func TestGhostSweepZeroesAGhostOnceTheDeviceWrites(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	_, keys := e.ghostsUnderL1(t, "w", 1)
	st := e.s.Stats()

	var zeroes atomic.Int64
	e.failWrites(&zeroes, func(task *xfer.Task) bool { return isValueWrite(task) || isZeroWrite(task) })
	e.clk.Advance(ghostSweepFirst)
	e.sweepEnded("the first zeroing, failing", 0, 1)
	if g, st2 := e.ghosts(keys[0]), e.s.Stats(); g != 1 || st2.QuarantinedSlots != st.QuarantinedSlots {
		t.Fatalf("after a failed zeroing: %d ghosts, stats %+v (before: %+v)", g, st2, st)
	}

	e.failWrites(&zeroes, isValueWrite)
	e.clk.Advance(2 * ghostSweepFirst)
	e.sweepEnded("the ghost zeroed", 1, 1)
	st2 := e.s.Stats()
	if g := e.ghosts(keys[0]); g != 0 || zeroes.Load() != 2 {
		t.Fatalf("%d ghosts left, %d zeroings asked, want 0 and 2", g, zeroes.Load())
	}
	if st2.QuarantinedSlots != st.QuarantinedSlots-1 || st2.L2Bytes >= st.L2Bytes || st2.L2Keys != 0 {
		t.Fatalf("stats after the sweep: %+v (before: %+v), want its slot free again", st2, st)
	}
	e.checkValues(keys, valuesFor(keys, 5000)) // the newer value, still in L1 only
	e.reopen()
	mustCodes(t, "after a restart without the L1 value", e.exists(keys), NotFound)
}

// logCount is a slog.Handler counting the records of one message.
type logCount struct {
	msg string
	n   *atomic.Int64
}

func (h logCount) Enabled(context.Context, slog.Level) bool { return true }
func (h logCount) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h logCount) WithGroup(string) slog.Handler            { return h }
func (h logCount) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}

// TestGhostSweepBacksOffWhileZeroingFails: while the device fails every
// zeroing, each pass of the sweep takes at most ghostSweepMax ghosts,
// all in flight at once, and the next comes twice as late, up to
// ghostSweepCap, with one log line per pass; once the device writes, a
// pass zeroes what it took and the rest follows at once.
func TestGhostSweepBacksOffWhileZeroingFails(t *testing.T) {
	const msg = "store: could not zero the headers of older L2 blocks kept out of use; retrying later"
	var logged atomic.Int64
	e := newEnv(t, 16<<20, withL2(32<<20), withCfg(func(c *Config) { c.Log = slog.New(logCount{msg, &logged}) }))
	_, keys := e.ghostsUnderL1(t, "b", ghostSweepMax+2)
	st := e.s.Stats()
	ghostsLeft := func() int {
		n := 0
		for _, k := range keys {
			n += e.ghosts(k)
		}
		return n
	}
	if g := ghostsLeft(); g != len(keys) {
		t.Fatalf("%d ghosts, want %d", g, len(keys))
	}

	// The first pass, held: a bounded number of zeroings in flight, the
	// other ghosts left for a later pass.
	var zeroes atomic.Int64
	e.failWrites(&zeroes, func(task *xfer.Task) bool { return isValueWrite(task) || isZeroWrite(task) })
	e.tr.Update(func(c *xfertest.Config) { c.Hold = isZeroWrite })
	e.clk.Advance(ghostSweepFirst)
	e.waitHeld("the first pass", ghostSweepMax)
	if g := ghostsLeft(); g != len(keys)-ghostSweepMax {
		t.Fatalf("%d ghosts left unclaimed during a pass, want %d", g, len(keys)-ghostSweepMax)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	if n := e.tr.Fail(errInjected); n != ghostSweepMax {
		t.Fatalf("%d zeroings held, want %d", n, ghostSweepMax)
	}
	fails := uint64(ghostSweepMax)
	e.sweepEnded("the first pass", 0, fails)

	// Every later pass fails at once: the zeroings asked at each second
	// of the clock.
	var got, want []int64
	delay := 2 * ghostSweepFirst
	next := delay
	passes := 1
	for now := time.Duration(0); now <= next && passes < 8; {
		if d, armed := e.sweepDue(); !armed || d != next-now {
			t.Fatalf("at %v after the first pass: the next pass due in %v (armed %v), want %v", now, d, armed, next-now)
		}
		before := zeroes.Load()
		e.clk.Advance(time.Second)
		now += time.Second
		w := int64(0)
		if now == next {
			w = ghostSweepMax
			fails += ghostSweepMax
			passes++
			e.sweepEnded(fmt.Sprintf("the pass at %v", now), 0, fails)
			delay = min(2*delay, ghostSweepCap)
			next = now + delay
		}
		got, want = append(got, zeroes.Load()-before), append(want, w)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("zeroings per second of the clock:\n got %v\nwant %v", got, want)
	}
	if delay != ghostSweepCap {
		t.Fatalf("the back-off reached %v, want the cap %v", delay, ghostSweepCap)
	}
	e.waitFor("a log line per failed pass", func() bool { return logged.Load() == int64(passes) })
	if g, st2 := ghostsLeft(), e.s.Stats(); g != len(keys) || st2.QuarantinedSlots != st.QuarantinedSlots || st2.GhostsZeroed != 0 {
		t.Fatalf("after the failed passes: %d ghosts, stats %+v (before: %+v)", g, st2, st)
	}

	// The device writes again: the pass due zeroes what it takes, and the
	// ghosts left are taken at once, the back-off back to its start.
	e.failWrites(&zeroes, isValueWrite)
	before := zeroes.Load()
	e.clk.Advance(delay)
	e.sweepEnded("every ghost zeroed", uint64(len(keys)), fails)
	if g, st2 := ghostsLeft(), e.s.Stats(); g != 0 || st2.QuarantinedSlots != st.QuarantinedSlots-uint64(len(keys)) ||
		zeroes.Load()-before != int64(len(keys)) {
		t.Fatalf("%d ghosts left, %d zeroings; stats %+v (before: %+v)", g, zeroes.Load()-before, st2, st)
	}
	if _, armed := e.sweepDue(); armed || e.s.l2.sweepDelay != ghostSweepFirst {
		t.Fatalf("a pass armed %v with no ghost left, back-off %v", armed, e.s.l2.sweepDelay)
	}
	if n := logged.Load(); n != int64(passes) {
		t.Fatalf("%d log lines, want %d: the successful passes logged", n, passes)
	}
	e.reopen()
	mustCodes(t, "after a restart without the L1 values", e.exists(keys), NotFound)
}

// TestGhostSweepRacingARemove: the sweep's zeroing of a ghost is in
// flight when the key's newer value, in L1 only, is removed. The Remove
// finds no ghost left to claim; it waits for the sweep's zeroing as for
// an older invalidation of the key, and the ghost is zeroed once. When
// the sweep's zeroing fails, the Remove zeroes the ghost itself, or
// answers the failure with the key kept when that fails too.
func TestGhostSweepRacingARemove(t *testing.T) {
	for _, c := range []struct {
		sweepFails, removeFails bool
	}{{false, false}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("sweep fails %v, remove fails %v", c.sweepFails, c.removeFails), func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20))
			_, keys := e.ghostsUnderL1(t, "r", 1)
			st := e.s.Stats()

			var zeroes atomic.Int64
			e.failWrites(&zeroes, isValueWrite)
			e.tr.Update(func(c *xfertest.Config) { c.Hold = isZeroWrite })
			e.clk.Advance(ghostSweepFirst)
			e.waitHeld("the sweep's zeroing", 1)
			codes, errs, rec := e.removePending(t, keys, "the sweep's zeroing")
			if n := e.tr.Held(); n != 1 {
				t.Fatalf("%d zeroings in flight, want the sweep's alone", n)
			}
			e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
			if c.removeFails {
				e.failWrites(&zeroes, func(task *xfer.Task) bool { return isValueWrite(task) || isZeroWrite(task) })
			}
			if c.sweepFails {
				e.tr.Fail(errInjected)
			} else {
				e.tr.release()
			}
			<-rec.done
			wantZeroes, zeroed := int64(1), uint64(1)
			if c.sweepFails {
				wantZeroes, zeroed = 2, 0
			}
			if c.removeFails {
				e.keptOverFailedZeroing(t, keys, codes, errs)
			} else {
				mustCodes(t, "remove", codes, OK)
				if errs[0] != nil {
					t.Fatal(errs[0])
				}
			}
			e.waitFor("no I/O in flight", func() bool { return e.s.Stats().IOInFlight == 0 })
			st2 := e.s.Stats()
			if n := zeroes.Load(); n != wantZeroes || st2.GhostsZeroed != zeroed {
				t.Fatalf("%d zeroings asked, %d by the sweep; want %d and %d", n, st2.GhostsZeroed, wantZeroes, zeroed)
			}
			if c.removeFails {
				if st2.RemoveFailures != st.RemoveFailures+1 || st2.QuarantinedSlots != st.QuarantinedSlots {
					t.Fatalf("stats after the failed remove: %+v (before: %+v)", st2, st)
				}
				return
			}
			if g := e.ghosts(keys[0]); g != 0 || st2.QuarantinedSlots != st.QuarantinedSlots-1 || st2.Keys != 0 {
				t.Fatalf("%d ghosts left; stats %+v (before: %+v)", g, st2, st)
			}
			e.reopen()
			mustCodes(t, "removed, after a restart", e.exists(keys), NotFound)
		})
	}
}

// TestGhostSweepKeepsASlotATransportMayStillWrite: a sweep zeroing whose
// Submit broke the transport contract is quarantined, and the transport
// may still carry out its zero write at any time. Its ghost stays a
// ghost, so a later pass zeroes the header again; the slot must stay out
// of use even then, or a block written there later would have its header
// zeroed by the stale write. Before, the later pass unquarantined it.
func TestGhostSweepKeepsASlotATransportMayStillWrite(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	_, keys := e.ghostsUnderL1(t, "t", 1)
	e.s.l2.mu.Lock()
	ghost := e.s.l2.ghosts[string(keys[0])][0]
	e.s.l2.mu.Unlock()
	st := e.s.Stats()

	// The sweep's Submit (one zeroing, alone) says it took two: the
	// transport holds the zero write, the store quarantines the task.
	var zeroes atomic.Int64
	var lie atomic.Bool
	e.failWrites(&zeroes, isValueWrite)
	e.tr.Update(func(c *xfertest.Config) {
		c.OnSubmit = func(ts []*xfer.Task) {
			lie.Store(len(ts) == 1 && isZeroWrite(ts[0]) && zeroes.Add(1) == 1)
		}
		c.Lie = func(n int, err error) (int, error) {
			if lie.Load() {
				return n + 1, nil
			}
			return n, err
		}
		c.Hold = isZeroWrite
	})
	e.clk.Advance(ghostSweepFirst)
	e.waitHeld("the sweep's zeroing, taken by a transport that lied", 1)
	e.sweepEnded("the quarantined zeroing", 0, 1)
	if g, st2 := e.ghosts(keys[0]), e.s.Stats(); g != 1 || st2.QuarantinedTasks != st.QuarantinedTasks+1 {
		t.Fatalf("after the violation: %d ghosts, stats %+v (before: %+v)", g, st2, st)
	}

	// The next pass zeroes the header; the stale write is still held.
	e.tr.Update(func(c *xfertest.Config) { c.Lie, c.Hold = nil, nil })
	e.clk.Advance(2 * ghostSweepFirst)
	e.sweepEnded("the ghost zeroed again", 1, 1)
	if n := e.tr.Held(); n != 1 {
		t.Fatalf("%d writes held, want the stale zeroing", n)
	}
	st2 := e.s.Stats()
	t2 := e.s.l2
	t2.mu.Lock()
	ri, _, j, _ := t2.slotAt(ghost)
	owner := t2.regions[ri].owner[j]
	t2.mu.Unlock()
	if g := e.ghosts(keys[0]); g != 0 || owner != quarOwner || st2.QuarantinedSlots != st.QuarantinedSlots {
		t.Fatalf("a slot with a write in flight: %d ghosts, owner %x, stats %+v (before: %+v); want it kept out of use",
			g, owner, st2, st)
	}
	e.tr.release() // the stale write lands; its Done is the transport's violation
	e.checkValues(keys, valuesFor(keys, 5000))
	e.reopen()
	mustCodes(t, "after a restart without the L1 value", e.exists(keys), NotFound)
}

// TestGhostSweepBackOffEndsOnceAGhostIsZeroed: the sweep's back-off, grown
// while the device failed, went back to its start only after a pass of
// its own zeroed a ghost. An invalidation that zeroes a ghost shows as
// well that the device writes again; the sweep then kept its long delay,
// and the key's other ghosts stayed valid (and their slots out of use)
// that much longer, as did every ghost made later.
func TestGhostSweepBackOffEndsOnceAGhostIsZeroed(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	_, keys := e.ghostsUnderL1(t, "o", 2)

	var zeroes atomic.Int64
	e.failWrites(&zeroes, func(task *xfer.Task) bool { return isValueWrite(task) || isZeroWrite(task) })
	delay, fails := ghostSweepFirst, uint64(0)
	for range 3 {
		e.clk.Advance(delay)
		fails += 2
		e.sweepEnded("a failing pass", 0, fails)
		delay *= 2
	}
	if d, armed := e.sweepDue(); !armed || d != delay {
		t.Fatalf("after the failed passes: the next due in %v (armed %v), want %v", d, armed, delay)
	}

	// The device writes again: a Remove zeroes its key's ghost.
	e.failWrites(&zeroes, isValueWrite)
	codes, errs := make([]Code, 1), make([]error, 1)
	rec := newRecorder()
	pending, err := e.s.Remove(keys[:1], codes, errs, rec, 1)
	if err != nil {
		t.Fatal(err)
	}
	if pending {
		<-rec.done
	}
	mustCodes(t, "remove", codes, OK)
	if d, armed := e.sweepDue(); !armed || d > ghostSweepFirst {
		t.Fatalf("once a ghost was zeroed: the next pass due in %v (armed %v), want within %v", d, armed, ghostSweepFirst)
	}
	e.clk.Advance(ghostSweepFirst)
	e.sweepEnded("the other ghost zeroed", 1, fails)
	if g := e.ghosts(keys[1]); g != 0 {
		t.Fatalf("%d ghosts left", g)
	}
}
