//go:build linux && cgo

package rdma

// Helpers of the real-verbs tests (verbs_linux_test.go and the other
// _linux_test.go files); the transport's logic runs over rdmatest in
// fabric_test.go.

import (
	"errors"
	"fmt"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// recorder records how tasks ended (xfertest.Recorder).
type recorder = xfertest.Recorder

func newRecorder() *recorder { return xfertest.NewRecorder() }

const (
	segLocal  xfer.SegmentID = 1
	segRemote xfer.SegmentID = 2
)

// noExports is a tcp.Exporter with nothing exported.
type noExports struct{}

func (noExports) Lookup(name string) (xfer.MemSegment, error) {
	return nil, fmt.Errorf("%q not exported", name)
}
func (noExports) Deliver(string, []byte) error { return errors.New("nothing exported") }
