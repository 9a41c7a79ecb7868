package rdma

import (
	"fmt"
	"log/slog"
)

// The verbs layer under a Transport and a Region. verbs_linux.go
// implements it over libibverbs (Device.NewTransport,
// Device.RegisterAccess); package rdmatest implements it in memory, so
// that code above this package (the daemon's peer plane) is tested without
// a device. A user of a transport never calls these: they are the
// boundary a provider plugs in at.

// WorkRequest is one RDMA READ or WRITE with a single scatter/gather
// entry, as the transport fills a queue pair's posting buffer. Its layout
// is shared with the C side (struct tc_wr in verbs_linux.h; a test checks
// size and offsets), so its fields are private and a provider reads them
// through the methods.
type WorkRequest struct {
	id       uint64 // wr_id: the send-queue sequence number
	laddr    uint64
	raddr    uint64
	length   uint32
	lkey     uint32
	rkey     uint32
	op       uint8
	signaled uint8
	_        [2]byte
}

// ID is the request's wr_id, which its completion carries back.
func (w *WorkRequest) ID() uint64 { return w.id }

// Write reports whether the request is an RDMA WRITE (local → remote);
// otherwise it is an RDMA READ (remote → local).
func (w *WorkRequest) Write() bool { return w.op == opWrite }

// Local is the local side: its address and the local key of its MR.
func (w *WorkRequest) Local() (addr uint64, lkey uint32) { return w.laddr, w.lkey }

// Remote is the remote side: its address and the remote key of the
// peer's MR.
func (w *WorkRequest) Remote() (addr uint64, rkey uint32) { return w.raddr, w.rkey }

// Len is how many bytes the request moves (0: a probe that moves none).
func (w *WorkRequest) Len() uint32 { return w.length }

// Signaled reports whether the request asks for a completion of its own;
// an unsignalled one is retired by the next signalled completion after it
// (RC queues complete in order), unless it fails, which always completes.
func (w *WorkRequest) Signaled() bool { return w.signaled != 0 }

// WorkCompletion is one work completion as the verbs layer reports it
// (struct tc_wc in verbs_linux.h mirrors it).
type WorkCompletion struct {
	id      uint64
	status  uint32
	vendor  uint32
	byteLen uint32
	_       uint32
}

// NewWorkCompletion is the completion of the work request with wr_id id:
// its status, and the bytes it moved.
func NewWorkCompletion(id uint64, status WCStatus, n uint32) WorkCompletion {
	return WorkCompletion{id: id, status: uint32(status), byteLen: n}
}

// QueuePair is what a transport needs of one RC queue pair.
type QueuePair interface {
	// WorkRequests is the posting buffer (Config.SendDepth entries) that
	// Post reads.
	WorkRequests() []WorkRequest
	// Post posts WorkRequests()[:n] as one linked list and returns how
	// many the provider took (n, unless err is non-nil).
	Post(n int) (int, error)
	// Connect takes the queue pair from any state through RESET, INIT and
	// RTR to RTS, receiving from remote and sending from local.PSN.
	Connect(local, remote *ConnInfo) error
	// Fail moves the queue pair to the error state: its posted work
	// requests complete with IBV_WC_WR_FLUSH_ERR.
	Fail() error
	// Reset moves it to RESET: whatever it had posted is dropped.
	Reset() error
	// QPN is the queue pair's number on its device.
	QPN() uint32
	// Destroy frees the queue pair; it is called once, after Reset.
	Destroy() error
}

// CompletionQueue is one queue pair's completion queue with its
// completion channel. Poll, Arm and TakeEvents are called by the queue
// pair's reaper (a reactor worker or the queue pair's goroutine), one at a
// time; Wait only by the queue pair's goroutine. While a queue pair
// changes hands, the goroutine and a worker may both take events: each
// event is taken once, by one of them.
type CompletionQueue interface {
	// Poll fills wcs and returns how many it filled.
	Poll(wcs []WorkCompletion) (int, error)
	// Arm asks for an event on the next completion.
	Arm() error
	// Wait blocks until an armed event arrives (true) or Wake was called
	// (false). With channel false it waits for Wake alone: a reactor
	// worker watches the channel meanwhile.
	Wait(channel bool) (bool, error)
	// Channel is the completion channel's file descriptor, readable
	// while it holds events (-1: none a worker can poll).
	Channel() int
	// TakeEvents takes and acknowledges the events the channel holds,
	// without blocking, and reports how many it took.
	TakeEvents() (int, error)
	// Wake makes a blocked Wait, or the next one, return false, once per
	// call (at least once for calls before that Wait).
	Wake()
	// Destroy frees the queue; it is called once, after every queue pair's
	// Destroy.
	Destroy() error
}

// NewTransport assembles a Transport over queue pairs and their completion
// queues (cqs[i] is qps[i]'s own) a provider created, and starts its
// goroutines. cfg's zero fields
// take the defaults; each queue pair's posting buffer must hold
// cfg.SendDepth requests. release, when not nil, runs once Close has
// destroyed the queues. Device.NewTransport is what a daemon calls.
func NewTransport(cfg Config, log *slog.Logger, addr Addr, cqs []CompletionQueue, qps []QueuePair, release func()) (*Transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if len(qps) == 0 {
		return nil, fmt.Errorf("rdma: a transport needs at least one queue pair")
	}
	if len(cqs) != len(qps) {
		return nil, fmt.Errorf("rdma: %d completion queues for %d queue pairs (want one each)", len(cqs), len(qps))
	}
	for i, q := range qps {
		if n := len(q.WorkRequests()); n != cfg.SendDepth {
			return nil, fmt.Errorf("rdma: queue pair %d posts from %d entries, SendDepth is %d", i, n, cfg.SendDepth)
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return newTransport("rdma", cfg, log, addr, cqs, qps, release), nil
}

// RegisterFunc registers [off, off+n) of a region as one MR and returns
// its keys and a handle for the region's DeregisterFunc.
type RegisterFunc func(off, n uint64) (lkey, rkey uint32, handle any, err error)

// DeregisterFunc releases one MR that a RegisterFunc made.
type DeregisterFunc func(handle any) error

// NewRegion registers [addr, addr+size) chunk by chunk (chunk is a power of
// two) with reg, on up to workers goroutines; access is what its MRs grant
// the peer. On a failure the chunks already registered are released with
// dereg. Release releases them all. Device.RegisterAccess is what a daemon
// calls.
func NewRegion(addr, size, chunk uint64, access Access, workers int, reg RegisterFunc, dereg DeregisterFunc) (*Region, error) {
	r, err := registerRegion(addr, size, chunk, workers, reg, dereg)
	if err != nil {
		return nil, err
	}
	r.access = access
	return r, nil
}
