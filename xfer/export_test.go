package xfer

import "time"

// What the external tests (package xfer_test) see of the engine's insides.

// ShrinkTasks is the size up to which task tables are always kept.
const ShrinkTasks = shrinkTasks

// SetWaitParked makes every Wait of e call fn with the batch id each time
// it has put itself on the batch's waiters, just before it sleeps. Set it
// while no Wait of e runs.
func SetWaitParked(e *Engine, fn func(BatchID)) { e.waitParked = fn }

// TaskTableCap is the capacity of batch id's task table.
func TaskTableCap(e *Engine, id BatchID) (int, error) {
	b, err := e.lock(id)
	if err != nil {
		return 0, err
	}
	defer b.mu.Unlock()
	return cap(b.tasks), nil
}

// EachTask calls fn for every task of batch id's table (used or not), with
// the batch locked.
func EachTask(e *Engine, id BatchID, fn func(i int, t *Task)) error {
	b, err := e.lock(id)
	if err != nil {
		return err
	}
	defer b.mu.Unlock()
	for i := range b.tasks {
		fn(i, &b.tasks[i])
	}
	return nil
}

// Waiters is the number of Waits sleeping on batch id.
func Waiters(e *Engine, id BatchID) (int, error) {
	b, err := e.lock(id)
	if err != nil {
		return 0, err
	}
	defer b.mu.Unlock()
	b.waitMu.Lock() // lock order: mu, then waitMu
	defer b.waitMu.Unlock()
	return len(b.waiters), nil
}

// SetClock makes e read its clock (submit calls, deadline checks, the
// meters) from now. Set it before e is used.
func SetClock(e *Engine, now func() time.Time) { e.clock = now }

// MetersOn says whether the meters are built in (not -tags nometers).
const MetersOn = metersOn

// SetSampler makes e ask pick, once per submit call that dispatches,
// whether the meters time that call's tasks, instead of its submitters'
// pseudo-random sequences. Set it before e is used.
func SetSampler(e *Engine, pick func() bool) { e.sample = pick }

// SetLocalChunkHook makes l call fn before it copies each chunk of a
// Submit larger than its inline bound, with worker false when the
// submitting goroutine copies it. Set it before l's first Submit.
func SetLocalChunkHook(l *Local, fn func(worker bool, n uint64)) { l.chunkHook = fn }
