//go:build linux && cgo

package rdma

// Helpers of the real-verbs tests (verbs_linux_test.go and the other
// _linux_test.go files); the transport's logic runs over rdmatest in
// fabric_test.go.

import (
	"errors"
	"fmt"

	"github.com/tensorcast/tensorcast/tcp"
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

func (noExports) Lookup(a tcp.Access) (xfer.MemSegment, tcp.Rights, error) {
	return nil, 0, fmt.Errorf("%q not exported", a.Name)
}
func (noExports) Deliver(tcp.Access, []byte) error { return errors.New("nothing exported") }
