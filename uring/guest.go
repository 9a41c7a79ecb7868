package uring

import "sync/atomic"

// A Guest is work a ring's thread serves beside the ring's own I/O: a
// reactor's client queues. Hosted by a ring (Transport.Host), it runs on
// the ring's poller, the one goroutine (locked to its OS thread) that also
// submits the ring's SQEs and reaps its CQEs, so that what the guest
// submits through the transport reaches the kernel, and its completions
// come back to the guest, without crossing another goroutine.
//
// Every method runs on the ring's thread, except where said.
type Guest interface {
	// Serve runs one bounded pass of the guest's work; it reports whether
	// it did any. Requests it submits to the transport with Task.Home
	// naming this ring go into the ring's next submission.
	Serve() bool
	// Sleep is called when the ring has nothing to do and is about to
	// sleep in the kernel. The guest prepares its own sleep, arming on w
	// the futex waits whose wake-up must end it, and reports false when
	// work came meanwhile (the ring then does not sleep).
	Sleep(w Waits) bool
	// Awake is called after every sleep Sleep agreed to.
	Awake()
	// Fired reports that the futex wait armed with token ended (woken, or
	// the word no longer held the value): it is no longer armed.
	Fired(token uint32)
	// Stop is called once, when the ring stops (the transport closes):
	// the guest is served no more. The ring's own I/O still completes
	// after it (their Done callbacks run on the ring's thread).
	Stop()
}

// Waits arms futex waits on the sleeping thread's behalf.
type Waits interface {
	// FutexWait arms a wait on the shared futex word w while it holds v:
	// a FUTEX_WAKE on w (from any process that maps it), or w holding
	// another value already, ends the sleep and reports token to
	// Guest.Fired. An armed wait stays armed across sleeps until it
	// fires. When none can be armed (a kernel without
	// IORING_OP_FUTEX_WAIT, a full submission queue) the sleep is
	// bounded instead, as with Soon.
	FutexWait(w *atomic.Uint32, v uint32, token uint32)
	// Soon bounds this sleep to about a millisecond, whatever is armed.
	Soon()
}
