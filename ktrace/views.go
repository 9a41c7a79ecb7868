package ktrace

import (
	"net/netip"

	"github.com/tensorcast/tensorcast/internal/loghist"
)

// View names one kernel-side view.
type View string

// The views Open can load.
const (
	ViewUring View = "uring" // io_uring submit→complete latency per ring
	ViewTCP   View = "tcp"   // TCP retransmits per connection
)

// Options tune the views.
type Options struct {
	// UringFlag, when not 0, is a single bit of an io_uring request's
	// user_data: the uring view then times only the requests that carry
	// it (see uring.Config.TraceEvery), and the others cost the programs
	// one read and one test. 0 times every request of this process.
	UringFlag uint64
}

// Ring is one io_uring ring of this process as the kernel saw it.
type Ring struct {
	// ID numbers the rings in the order this package first saw them
	// (1, 2, ...); the kernel's own ring address is never exposed.
	ID int
	// Latency is submit→complete, nanoseconds, per loghist bucket.
	Latency loghist.Snapshot
}

// Tuple is a TCP connection as its local end sees it.
type Tuple struct {
	Local, Remote netip.AddrPort
}

// Retransmit is one connection's retransmitted segments (skbs) count.
type Retransmit struct {
	Tuple Tuple
	Count uint64
}
