// Package testhook holds the hooks that the tests of one package set in
// the code of another: the control server's tests reach into the queue
// workers of package session through them. Each is nil outside tests and
// costs one atomic load where it is checked.
package testhook

import "sync/atomic"

var (
	// QueuePublish, when set, runs on a queue's worker between preparing
	// the entries it took and publishing sq_head.
	QueuePublish atomic.Pointer[func()]
	// StoreDone, when set, runs at the end of a queue's store completion
	// (StoreDone).
	StoreDone atomic.Pointer[func()]
)
