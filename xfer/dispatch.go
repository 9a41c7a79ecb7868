package xfer

// The caller's side of the Transport contract, kept in one place for every
// party that hands tasks to a transport (a batch, a Stream, the store's L2
// tier).
//
// Dispatch makes one Transport.Submit call and settles it:
//   - The count n that Submit returns is the only boundary between the
//     completion path and the caller's rollback. tasks[:n] are the
//     transport's: each ends by exactly one Done, whose completer releases
//     what the caller took for it. tasks[n:] were never dispatched:
//     Dispatch gives them back (Task.Undispatched) and the caller releases
//     them itself, at once, and ends them with Dispatched.Err.
//   - A transport that answers a count its error or the number of tasks
//     contradicts (negative, past the end, short without an error, full
//     with one), calls Done for a task of tasks[n:], or calls Done twice
//     for a task before Dispatch returns, broke the contract: the whole call
//     is an error, whatever the tasks' own results said. Dispatched.Broke
//     says which; the caller fails every task of the call and quarantines
//     what the transport may still touch.
//
// A task's ledger is one atomic word (Task.owed) that exactly one party
// claims: the transport's Done (ClaimDone) or the caller (Dispatch for the
// tail, Reclaim for a call whose transport broke the contract). The party
// that claims it releases what was taken for the task; the other touches
// nothing of it. While Dispatch has not settled a task, a Done that finds
// nothing to claim is that call's breach, reported once by the call;
// after, it is the completer's to report. The caller keeps its own task
// states (parked results, deadlines) and its own counts; the ledger only
// says who owns each task.

// The bits of a task's ledger word.
const (
	// owedDone: the transport took the task and owes its Done.
	owedDone uint32 = 1 << iota
	// owedSettling: the Dispatch call of the task has not settled it yet.
	owedSettling
	// owedBack: the caller has the task back (the transport never took
	// it, or broke the contract and was disowned).
	owedBack
	// owedStray: a Done the transport did not owe came while the task
	// was settling.
	owedStray
)

// Breach names how a transport broke the contract in one Submit call.
type Breach uint8

const (
	// Kept: the transport kept the contract.
	Kept Breach = iota
	// BadCount: the count contradicts the error or the number of tasks.
	BadCount
	// DoneUndispatched: a Done came for a task the count did not take.
	DoneUndispatched
	// SecondDone: a second Done came for a task before Dispatch
	// returned. Its completer refused it (DoneStray) and left the report
	// to the call.
	SecondDone
)

func (b Breach) String() string {
	switch b {
	case Kept:
		return "kept"
	case BadCount:
		return "dispatch count"
	case DoneUndispatched:
		return "done for an undispatched task"
	case SecondDone:
		return "second Done"
	}
	return "invalid"
}

// Dispatched is what one Transport.Submit call came to.
type Dispatched struct {
	// N is the count Submit returned; K is N within 0..len(tasks), the
	// tasks the transport owns: tasks[:K].
	N, K int
	// Err ends the tasks given back: Submit's error, or ErrTransport when
	// the count broke the contract or came without an error.
	Err error
	// Broke is Kept, or the first way the call broke the contract.
	Broke Breach
}

// Kept reports whether the transport kept the contract in this call.
func (d Dispatched) Kept() bool { return d.Broke == Kept }

// Dispatch hands tasks to tr in one Submit call and settles the count it
// answers, as the contract above says. Each task of tasks[d.K:] is either
// given back (Undispatched: the caller releases it and ends it with d.Err)
// or, when the transport broke the contract, ended by a Done that came for
// it anyway (its completer released it). The caller sets its own task
// states before the call: a Done may come before Submit returns. Dispatch
// itself allocates nothing.
func Dispatch(tr Transport, tasks []*Task) Dispatched {
	for _, t := range tasks {
		t.owed.Store(owedDone | owedSettling)
	}
	n, err := tr.Submit(tasks)
	d := Dispatched{N: n, K: n, Err: err}
	switch {
	case n < 0:
		d.K, d.Broke = 0, BadCount
	case n > len(tasks):
		d.K, d.Broke = len(tasks), BadCount
	case n < len(tasks) && err == nil, n == len(tasks) && err != nil:
		d.Broke = BadCount
	}
	if d.Broke != Kept || d.Err == nil {
		d.Err = ErrTransport
	}
	for _, t := range tasks[d.K:] {
		if t.owed.CompareAndSwap(owedDone|owedSettling, owedBack) {
			continue
		}
		// A Done claimed it.
		t.owed.And(^owedSettling)
		if d.Broke == Kept {
			d.Broke = DoneUndispatched
		}
	}
	for _, t := range tasks[:d.K] {
		if t.owed.And(^owedSettling)&owedStray != 0 && d.Broke == Kept {
			d.Broke = SecondDone
		}
	}
	return d
}

// DoneClaim is what ClaimDone found.
type DoneClaim uint8

const (
	// DoneOwed: the Done the transport owed. The completer releases what
	// was taken for the task and ends it.
	DoneOwed DoneClaim = iota
	// DoneStray: a Done the transport did not owe, while the task's
	// Dispatch call was settling it; that call reports the breach.
	DoneStray
	// DoneLate: a Done the transport did not owe, after its Dispatch
	// call: the completer reports the breach itself.
	DoneLate
)

// ClaimDone is the completion path's half of the ledger; a Completer's
// TaskDone calls it first. Only the Done it finds owed (DoneOwed) releases
// what was taken for t, so that happens exactly once. Any other Done (a
// second one, or one for a task the transport did not take or the caller
// took back) touches nothing of t's.
func (t *Task) ClaimDone() DoneClaim {
	for {
		v := t.owed.Load()
		switch {
		case v&owedDone != 0:
			if t.owed.CompareAndSwap(v, v&^owedDone) {
				return DoneOwed
			}
		case v&owedSettling != 0:
			if t.owed.CompareAndSwap(v, v|owedStray) {
				return DoneStray
			}
		default:
			return DoneLate
		}
	}
}

// Undispatched reports whether Dispatch gave t back to the caller: the
// transport did not take it, and the caller releases it.
func (t *Task) Undispatched() bool { return t.owed.Load()&owedBack != 0 }

// Reclaim takes t back from a transport that broke the contract, so that
// no later Done of t's touches anything; a caller that quarantines the
// tasks of such a call uses it once Dispatch has returned. It reports
// whether t is the caller's now (taken back here or by Dispatch); false
// means a Done claimed t first, and that Done may still be running.
func (t *Task) Reclaim() bool {
	return t.owed.CompareAndSwap(owedDone, owedBack) || t.Undispatched()
}

// outstanding reports whether t's transport still owes its Done.
func (t *Task) outstanding() bool { return t.owed.Load()&owedDone != 0 }
