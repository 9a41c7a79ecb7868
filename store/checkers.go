package store

// Checkers: a device may complete a whole batch of reads at once (a
// virtual disk does: the completions of 32 reads of 256 KiB come within a
// few microseconds of each other), and the completion goroutine that
// checks each value's crc32c before ending its promotion would then check
// them one after the other while the call waits for the last. So when more
// promotions are in flight, the completion goroutine hands a value to an
// idle checker and goes on with the next completion, which it checks
// itself if no checker is free: the checks of one burst are shared between
// it and the checkers. A lone promotion is checked where it completes (a
// hand-off would cost more than its check), and so is every promotion when
// GOMAXPROCS is 1.
//
// The checkers are the tier's: started by newTier2, stopped by
// stopCheckers (closeNow, and Close after a drain that timed out), which
// refuses further hand-offs, closes chk and waits until every checker has
// ended what it was given. After that every promotion is checked where it
// completes.

// maxCheckers bounds the checkers of a tier.
const maxCheckers = 3

// checkersFor is how many checkers a tier runs with procs OS threads
// running Go: one fewer (the completion goroutine checks too), at most
// maxCheckers.
func checkersFor(procs int) int { return max(0, min(procs-1, maxCheckers)) }

func (t *tier2) startCheckers(n int) {
	t.chk = make(chan *ioTask, n)
	t.chkIdle, t.chkStopped = n, false
	for range n {
		t.chkWG.Add(1)
		go t.checker()
	}
}

// checker checks the values handed to it until chk is closed.
func (t *tier2) checker() {
	defer t.chkWG.Done()
	for it := range t.chk {
		t.checkPromoted(it, nil)
		t.chkMu.Lock()
		t.chkIdle++
		t.chkMu.Unlock()
	}
}

// handToChecker gives it to an idle checker; false when none is idle (or
// the checkers are stopped), and then the caller checks it.
func (t *tier2) handToChecker(it *ioTask) bool {
	t.chkMu.Lock()
	defer t.chkMu.Unlock()
	if t.chkIdle == 0 || t.chkStopped {
		return false
	}
	t.chkIdle--
	t.chk <- it // room for it: one slot per checker, and this one was idle
	t.handed++
	return true
}

// stopCheckers stops the checkers once they have ended what they were
// given. Idempotent.
func (t *tier2) stopCheckers() {
	t.chkMu.Lock()
	if !t.chkStopped && t.chk != nil {
		t.chkStopped = true
		close(t.chk)
	}
	t.chkMu.Unlock()
	t.chkWG.Wait()
}
