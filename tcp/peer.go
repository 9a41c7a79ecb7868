package tcp

// peer: what a Node keeps about one peer daemon (its sessions, epochs,
// credit and send queue).

import (
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/xfer"
)

// peer is the state kept about one peer daemon.
type peer struct {
	id                      string
	bytesIn, bytesOut, errs atomic.Uint64
	slice                   atomic.Int64 // slice size agreed with the current session

	// kick wakes the peer's pump (capacity 1, never closed).
	kick chan struct{}

	// mu guards the fields below, the reqs, due, inflight, timedOut,
	// closed, dropping and stall fields of this peer's connections (and
	// the due fields of their requests), and the queue fields of the task
	// states in queued.
	mu       sync.Mutex
	epoch    uint64   // current epoch, 0 until a handshake told us
	blob     []byte   // opaque data from the peer's last handshake
	retired  []uint64 // epochs a newer one replaced (bounded)
	sess     []*conn  // outbound connections carrying our requests
	inbound  map[*conn]struct{}
	inflight int64
	wake     chan struct{} // closed when credit frees; nil while nobody waits
	// changes counts wakeLocked calls, so that the pump, which tries to
	// send without p.mu held, can tell credit freed (or a connection came
	// or went) between its try and its wait: wake was still nil then.
	changes uint64
	rr      int

	// The queue (pump.go): tasks that wait for a session or for room,
	// oldest first, the same tasks by when their wait ends (for the
	// reaper), and every task the pump holds, by task (for Cancel).
	head, tail *taskState
	waits      dueHeap[*taskState]
	queued     map[*xfer.Task]*taskState
	pumping    bool // the pump goroutine runs
	// wantDial asks the pump for a session; sessWait is closed when the
	// dial it asked for ended, with dialErr its error.
	wantDial bool
	sessWait chan struct{}
	dialErr  error
}

const maxRetired = 16

func (p *peer) isRetiredLocked(e uint64) bool {
	for _, r := range p.retired {
		if r == e {
			return true
		}
	}
	return false
}

// adoptEpochLocked records that the peer runs epoch e. A new epoch
// replaces the old session: the returned connections belong to the old
// one and must be closed by the caller.
func (p *peer) adoptEpochLocked(e uint64) (old []*conn) {
	if p.epoch == e {
		return nil
	}
	if p.epoch != 0 {
		if len(p.retired) == maxRetired {
			copy(p.retired, p.retired[1:])
			p.retired = p.retired[:maxRetired-1]
		}
		p.retired = append(p.retired, p.epoch)
		old = append(old, p.sess...)
		p.sess = nil
		for c := range p.inbound {
			if c.epoch != e {
				old = append(old, c)
			}
		}
	}
	p.epoch = e
	return old
}

// wakeChanLocked is the channel wakeLocked closes next, made for the
// caller to wait on (p.mu held; wait after releasing it).
func (p *peer) wakeChanLocked() chan struct{} {
	if p.wake == nil {
		p.wake = make(chan struct{})
	}
	return p.wake
}

// wakeLocked tells credit waiters that something changed.
func (p *peer) wakeLocked() {
	p.changes++
	if p.wake != nil {
		close(p.wake)
		p.wake = nil
	}
}

// liveLocked reports whether the peer's current session is live: outbound
// connections up, or inbound ones of its current epoch open. p.mu is held.
func (p *peer) liveLocked() bool {
	if len(p.sess) > 0 {
		return true
	}
	for c := range p.inbound {
		if c.epoch == p.epoch {
			return true
		}
	}
	return false
}
