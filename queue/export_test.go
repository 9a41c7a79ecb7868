package queue

import (
	"sync/atomic"
	"testing"
)

// What the package's external tests (stress_test.go) use of its insides.

// Pair is pair.
func Pair(t testing.TB, sq, cq, data uint32) (*DaemonRing, *ClientRing) { return pair(t, sq, cq, data) }

// Echo is echo.
func Echo(d *DaemonRing, jitter bool, stop *atomic.Bool) { echo(d, jitter, stop) }

// NoSpin turns the client's spin off: it sleeps at once.
func (q *ClientRing) NoSpin() { q.spin = spinner{} }
