package grant

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Mode is how strongly a daemon governs the remote work it takes on (seed
// 003): an admission budget for the remote gets its clients start and for
// the bytes per second it serves to other hosts' reads. A mode changes
// budgets only, never what an answer is: a get refused by the budget is a
// named RESOURCE_EXHAUSTED, never wrong bytes or a silent miss.
type Mode uint8

const (
	// LocalFirst: the loosest gates; the daemon decides alone and remote
	// work is bounded only against overload.
	LocalFirst Mode = iota
	// BudgetedHybrid: finite budgets for remote gets in flight and for
	// serving other hosts (the default).
	BudgetedHybrid
	// GlobalGoverned: the strictest gates, for a fleet that protects its
	// critical flows first.
	GlobalGoverned
)

var modeNames = [...]string{"local-first", "budgeted-hybrid", "global-governed"}

func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", m)
}

// ParseMode parses a mode's name.
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if s == n {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w: mode %q (want local-first, budgeted-hybrid or global-governed)", ErrInvalid, s)
}

// Budget is a mode's admission budget.
type Budget struct {
	// RemoteGets is how many remote gets this daemon's clients may have in
	// flight at once.
	RemoteGets int
	// ServeBytesPerSec is how many bytes per second this daemon serves to
	// other hosts' reads (a token bucket holding one second's worth); 0 is
	// no bound.
	ServeBytesPerSec uint64
}

// DefaultBudgets are the budgets of the modes, by Mode.
var DefaultBudgets = [...]Budget{
	LocalFirst:     {RemoteGets: 1024, ServeBytesPerSec: 0},
	BudgetedHybrid: {RemoteGets: 256, ServeBytesPerSec: 8 << 30},
	GlobalGoverned: {RemoteGets: 64, ServeBytesPerSec: 2 << 30},
}

// Admission applies the current mode's budget to remote work. The
// cluster's reader calls BeginRemoteGet before a remote get and the
// returned func when it ends; its holder side calls Serve before it
// serves another host's read.
type Admission struct {
	clock Clock

	// mu guards the fields below.
	mu      sync.Mutex
	mode    Mode
	budgets [len(modeNames)]Budget
	gets    int     // remote gets in flight
	tokens  float64 // bytes the bucket holds
	last    time.Time
	stats   AdmissionStats
}

// AdmissionStats are the admission's counters.
type AdmissionStats struct {
	Mode          Mode
	Budget        Budget
	RemoteGets    uint64 // remote gets in flight
	GetsAdmitted  uint64
	GetsRefused   uint64
	ServedBytes   uint64
	ServesRefused uint64
	ModeChanges   uint64
}

// NewAdmission starts in mode with budgets (zero value: DefaultBudgets)
// on clock (nil: the wall clock).
func NewAdmission(mode Mode, budgets *[3]Budget, clock Clock) (*Admission, error) {
	if int(mode) >= len(modeNames) {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, mode)
	}
	if clock == nil {
		clock = wallClock{}
	}
	a := &Admission{clock: clock, mode: mode, budgets: DefaultBudgets}
	if budgets != nil {
		for i, b := range budgets {
			if b.RemoteGets <= 0 {
				return nil, fmt.Errorf("%w: %v admits %d remote gets", ErrInvalid, Mode(i), b.RemoteGets)
			}
		}
		a.budgets = *budgets
	}
	a.last = clock.Now()
	a.tokens = a.burst()
	return a, nil
}

// burst is the bucket's size: one second of the serve rate. a.mu is held.
func (a *Admission) burst() float64 {
	r := a.budgets[a.mode].ServeBytesPerSec
	if r == 0 {
		return math.Inf(1)
	}
	return float64(r)
}

// Mode is the current mode.
func (a *Admission) Mode() Mode {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mode
}

// SetMode changes the mode (and so the budgets) from now on: remote gets
// in flight over the new budget finish, new ones wait for room; the
// bucket starts full at the new rate.
func (a *Admission) SetMode(m Mode) error {
	if int(m) >= len(modeNames) {
		return fmt.Errorf("%w: %v", ErrInvalid, m)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if m != a.mode {
		a.mode = m
		a.stats.ModeChanges++
		a.last, a.tokens = a.clock.Now(), a.burst()
	}
	return nil
}

// BeginRemoteGets admits up to n remote gets: as many as the mode's
// gets in flight leave room for, the first ones asked. When it admits
// fewer than n, err is ErrOverBudget (the others are refused). Each get
// admitted gives its place back with EndRemoteGets once it is over.
func (a *Admission) BeginRemoteGets(n int) (admitted int, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.budgets[a.mode].RemoteGets
	admitted = max(0, min(n, b-a.gets))
	a.gets += admitted
	a.stats.GetsAdmitted += uint64(admitted)
	if admitted < n {
		a.stats.GetsRefused += uint64(n - admitted)
		return admitted, fmt.Errorf("%w: %d remote gets in flight (%v admits %d)", ErrOverBudget, a.gets, a.mode, b)
	}
	return admitted, nil
}

// EndRemoteGets gives back the places of n remote gets BeginRemoteGets
// admitted, once they are over (the count never goes below none in
// flight: a get ended twice does not make room for one more).
func (a *Admission) EndRemoteGets(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gets = max(0, a.gets-max(0, n))
}

// Serve takes n bytes from the serve budget before this daemon serves
// another host's read, or refuses with ErrOverBudget when the bucket
// does not hold them. A read larger than the bucket is admitted when the
// bucket is full, which leaves it in debt for the time the read is worth.
func (a *Admission) Serve(n uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	rate := a.budgets[a.mode].ServeBytesPerSec
	if rate == 0 {
		a.stats.ServedBytes += n
		return nil
	}
	now := a.clock.Now()
	burst := a.burst()
	if dt := now.Sub(a.last); dt > 0 {
		a.tokens = math.Min(burst, a.tokens+dt.Seconds()*float64(rate))
		a.last = now
	}
	if a.tokens < math.Min(float64(n), burst) {
		a.stats.ServesRefused++
		return fmt.Errorf("%w: %d bytes to serve, %.0f of %d per second left (%v)", ErrOverBudget, n, a.tokens, rate, a.mode)
	}
	a.tokens -= float64(n)
	a.stats.ServedBytes += n
	return nil
}

// Stats reports the mode, its budget and the counters.
func (a *Admission) Stats() AdmissionStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.Mode, s.Budget, s.RemoteGets = a.mode, a.budgets[a.mode], uint64(a.gets)
	return s
}
