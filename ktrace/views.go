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
