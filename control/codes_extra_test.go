package control

import (
	"fmt"
	"testing"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/peer"
)

// TestPeerErrorCodes: the peer plane's sentinels reach clients as their
// codes, wrapped or not.
func TestPeerErrorCodes(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Code
	}{
		{peer.ErrNotFound, tcproto.CodeNOT_FOUND},
		{peer.ErrInvalid, tcproto.CodeINVALID_ARGUMENT},
		{peer.ErrLimit, tcproto.CodeRESOURCE_EXHAUSTED},
		{peer.ErrUnavailable, tcproto.CodeUNAVAILABLE},
		{fmt.Errorf("%w: d1/kv was opened with transport rdma and its rdma link is down", peer.ErrUnavailable), tcproto.CodeUNAVAILABLE},
		{fmt.Errorf("%w: remote name %q", peer.ErrInvalid, "x"), tcproto.CodeINVALID_ARGUMENT},
	} {
		if got := CodeOf(c.err); got != c.want {
			t.Errorf("CodeOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
