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
	// Fired reports that the wait armed with token ended, with the
	// kernel's result res (a futex wait: 0 woken, -EAGAIN the word no
	// longer held the value; an eventfd read: 8, or a negative errno; a
	// poll: its revents, or a negative errno): it
	// is no longer armed. A wait that could not be armed fires with 0
	// when its sleep ends.
	Fired(token uint32, res int32)
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
	// IORING_OP_FUTEX_WAIT, a full submission queue, or as many waits
	// in the kernel as the ring's completion queue holds beside the
	// ring's own requests) the sleep is bounded instead, as with Soon.
	FutexWait(w *atomic.Uint32, v uint32, token uint32)
	// FDWait arms a read of 8 bytes from the eventfd fd (the value is
	// dropped): a write to it (from any process holding it), or a count
	// in it already, ends the sleep and reports token to Guest.Fired. It
	// stays armed across sleeps until it fires, as FutexWait's, and with
	// the SQ full the sleep is bounded instead. The read holds its own
	// reference to the file: fd may be closed while it is armed.
	FDWait(fd int, token uint32)
	// PollWait arms a one-shot poll of fd for POLLIN (an RDMA completion
	// channel): fd becoming readable, or being readable already, ends the
	// sleep and reports token to Guest.Fired with the poll's revents (or
	// a negative errno). Nothing is read: the guest takes what made fd
	// readable itself, or the next poll fires at once. It stays armed
	// across sleeps until it fires, as FDWait's, and holds its own
	// reference to the file; with the SQ full the sleep is bounded
	// instead.
	PollWait(fd int, token uint32)
	// CancelWait cancels the wait armed with token, if it is still in the
	// kernel (its Fired then comes with -ECANCELED, or with its own
	// result if it fired first). It reports false when no SQE was free
	// (the submission queue full, or the completion queue's share of
	// the guest taken): ask again at the next sleep.
	CancelWait(token uint32) bool
	// Soon bounds this sleep to about a millisecond, whatever is armed.
	Soon()
	// Poll asks to poll instead of sleeping, for one more pass: it
	// reports true when the host has nothing of its own in flight (no
	// request in the kernel, none waiting to go there, no completion to
	// reap), so that the guest's own passes see everything that can come.
	// The guest then declines this sleep (Sleep false), and the host
	// passes again without entering the kernel when it has nothing to
	// submit. With false the guest prepares its sleep as usual.
	Poll() bool
}
