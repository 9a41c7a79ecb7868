package store

import (
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// The ghost sweep. A ghost (tier2.ghosts) is zeroed first by the next
// invalidation of its key, but a key may see none for long: until then a
// restart without the L1 journal brings the ghost's older value back when
// the key's newer value was in L1 only, and the ghost's slot stays out of
// use. So the maintenance loop zeroes ghosts on its own, in passes. A pass
// is due ghostSweepFirst after a ghost is made; it claims up to
// ghostSweepMax ghosts and zeroes each with a task of its own (kSweep),
// through the same transport path as an invalidation. When its last
// zeroing ends, the next pass is due: at once when every zeroing
// succeeded and ghosts are left (a pass is bounded, not the sweep),
// ghostSweepFirst later when some succeeded, and twice the last delay
// (up to ghostSweepCap) when none did, so a device that keeps failing
// sees a few writes a minute, and the log a line per pass. An
// invalidation that zeroes a ghost ends the back-off too (ghostZeroed).
//
// A sweep zeroing keeps the invalidations' claim protocol. Its ghost is
// taken out of tier2.ghosts, so no invalidation of the key zeroes it too,
// and it counts in tier2.older for the key, as the invalidation of a
// superseded entry does, in the same hold of t.mu: an invalidation of the
// key that finds no ghost left parks until the zeroing ends (reqInval),
// and the removal of a value in L1 only waits for it (olderHeaders).
// When it ends, its slot is unquarantined, or it is a ghost of its key
// again, and the key's parked invalidations go on (resumeInval): the first
// of them finds the ghost again and zeroes it itself.
const (
	ghostSweepFirst = time.Second
	ghostSweepCap   = time.Minute
	ghostSweepMax   = 4 // a pass's zeroings, all in flight at once
)

// startSweep lets ghosts arm the sweep, those recovery found first. New
// calls it as the maintenance loop starts.
func (t *tier2) startSweep() {
	t.mu.Lock()
	t.sweepOn = true
	if len(t.ghosts) > 0 {
		t.armSweep(t.sweepDelay)
	}
	t.mu.Unlock()
}

// stopSweep disarms the sweep for good (Close, the loop stopped). A pass
// in flight ends as its zeroings do, arming nothing.
func (t *tier2) stopSweep() {
	t.mu.Lock()
	t.sweepOn, t.sweepArmed = false, false
	if t.sweepTimer != nil {
		t.sweepTimer.Stop()
		t.sweepTimer = nil
	}
	t.mu.Unlock()
}

// armSweep makes a pass due after d. t.mu is held.
func (t *tier2) armSweep(d time.Duration) {
	if !t.sweepOn {
		return
	}
	if t.sweepTimer != nil {
		t.sweepTimer.Stop()
		t.sweepTimer = nil
	}
	s := t.s
	t.sweepArmed, t.sweepAt = true, s.now()+int64(d)
	if d == 0 {
		s.kick() // a leaf: it only sends, without blocking
		return
	}
	t.sweepTimer = s.clock.AfterFunc(d, s.kick)
}

// sweepGhosts starts a pass of the ghost sweep if one is due.
func (s *Store) sweepGhosts(m *maintScratch) {
	t := s.l2
	t.mu.Lock()
	due := t.sweepArmed && t.sweepRunning == 0 && s.now() >= t.sweepAt
	if due {
		t.sweepArmed = false
	}
	t.mu.Unlock()
	if !due {
		return
	}
	// The tasks first: t.mu and ioMu are both leaves.
	batch := m.batch[:0]
	for range min(int(t.nghosts.Load()), ghostSweepMax) {
		it := t.getTask(true)
		if it == nil {
			break
		}
		batch = append(batch, it)
	}
	t.mu.Lock()
	n := 0
	for key := range t.ghosts {
		for n < len(batch) {
			g := t.takeGhostLocked(key)
			if g == noSlot {
				break
			}
			it := batch[n]
			n++
			it.kind, it.key, it.ghost = kSweep, key, g
			t.olderStartsLocked(key)
			_, _, _, off := t.slotAt(it.ghost)
			t.reqSector(it, xfer.OpWrite, off, true)
		}
		if n == len(batch) {
			break
		}
	}
	t.sweepRunning, t.sweepOK, t.sweepFailed, t.sweepErr = n, 0, 0, nil
	if n == 0 && len(t.ghosts) > 0 {
		// No task was free for the store's own work: the pass is put off,
		// at the same back-off.
		t.armSweep(t.sweepDelay)
	}
	t.mu.Unlock()
	for _, it := range batch[n:] {
		t.freeTask(it) // invalidations of their keys took the ghosts meanwhile
	}
	m.batch = batch
	t.submit(batch[:n], &m.xts) // a violation has failed the tasks already
	clear(batch)
}

// sweepDone ends a sweep zeroing, and with the last of its pass the pass.
func (t *tier2) sweepDone(it *ioTask, err error) {
	s := t.s
	t.mu.Lock()
	if err != nil {
		t.addGhost(it.key, it.ghost) // arms nothing while its pass runs
		t.sweepFailed++
		t.sweepErr = err
		s.c.ghostZeroFail.Add(1)
	} else {
		t.unquarantine(it.ghost)
		t.sweepOK++
		s.c.ghostsZeroed.Add(1)
	}
	resume := t.olderEnds(it.key) // the key's invalidations that waited for it
	t.sweepRunning--
	var failed int
	var ferr error
	var delay time.Duration
	if t.sweepRunning == 0 {
		failed, ferr = t.sweepFailed, t.sweepErr
		delay = t.endSweepPass()
	}
	left := t.nghosts.Load()
	t.mu.Unlock()
	if failed > 0 {
		// A line per failed pass: at most one per step of the back-off.
		s.log.Warn("store: could not zero the headers of older L2 blocks kept out of use; retrying later",
			"failed", failed, "ghosts", left, "retry_in", delay, "err", ferr)
	}
	t.freeTask(it)
	for _, p := range resume {
		t.resumeInval(p) // the first zeroes the ghost again if it is one
	}
}

// ghostZeroed ends the sweep's back-off once an invalidation has zeroed
// a ghost: the device writes again, so the ghosts left (and those made
// later) are not kept waiting for a delay grown while it failed. t.mu is
// held.
func (t *tier2) ghostZeroed() {
	t.sweepDelay = ghostSweepFirst
	if t.sweepArmed && t.sweepAt > t.s.now()+int64(ghostSweepFirst) {
		t.armSweep(ghostSweepFirst)
	}
}

// endSweepPass sets the back-off once a pass's zeroings have all ended,
// arms the next pass if ghosts are left, and returns its delay. t.mu is
// held.
func (t *tier2) endSweepPass() time.Duration {
	d := time.Duration(0)
	switch {
	case t.sweepFailed == 0:
		t.sweepDelay = ghostSweepFirst
	case t.sweepOK > 0:
		t.sweepDelay = ghostSweepFirst
		d = t.sweepDelay
	default:
		t.sweepDelay = min(2*t.sweepDelay, ghostSweepCap)
		d = t.sweepDelay
	}
	if len(t.ghosts) > 0 {
		t.armSweep(d)
	}
	return d
}
