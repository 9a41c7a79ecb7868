package session

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
)

// TestInPartsPanic: a panic in a part of a cut store call, on a goroutine
// of its own or on the caller's, reaches the caller (the connection's
// serving goroutine, whose recover ends that call alone) instead of
// killing the daemon, and only once every part ended: the parts write the
// call's results and copy memory whose references the caller drops as it
// unwinds.
func TestInPartsPanic(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	val := make([]byte, partMin)
	mem := [][]byte{val, val} // two parts: [0, 1) on the caller, [1, 2) on a goroutine
	for _, panicking := range []int{0, 1} {
		t.Run(fmt.Sprintf("part %d", panicking), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				started, release := make(chan struct{}), make(chan struct{})
				unwound := make(chan any, 1)
				go func() {
					defer func() { unwound <- recover() }()
					(&Session{}).inParts(mem, func(lo, _ int) error { //nolint:errcheck // it panics
						if lo == panicking {
							<-started // the other part is running
							panic("part failed")
						}
						close(started)
						<-release
						return nil
					})
				}()
				synctest.Wait() // every goroutine of the test is durably blocked, or gone
				early := len(unwound) > 0
				close(release)
				r := <-unwound
				if early {
					t.Fatal("inParts unwound while a part still ran")
				}
				if r == nil || !strings.Contains(fmt.Sprint(r), "part failed") {
					t.Fatalf("recovered %v, want the part's panic", r)
				}
			})
		})
	}
}
