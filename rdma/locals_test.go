package rdma

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

func TestRemoveLocal(t *testing.T) {
	la, rb := pattern(1<<20, 3), make([]byte, 1<<20)
	a, b := exposedPair(t, la, rb)
	ch := directChannel{"bravo/" + ExchangeKind: Acceptor(func(string, uint64) (*Transport, error) { return b.t, nil })}
	if err := a.t.Connect(ChannelPeer{Ch: ch, ID: "bravo"}); err != nil {
		t.Fatal(err)
	}
	if err := a.t.AddRemote(segRemote, a.t.PeerRegions()[0]); err != nil {
		t.Fatal(err)
	}
	moveAndCheck(t, a, segRemote, la, 64<<10)
	a.t.RemoveLocal(segLocal)
	r := newRecorder()
	for _, op := range []xfer.Op{xfer.OpWrite, xfer.OpRead} {
		gone := tasksOf(r, xfer.Request{Op: op, Local: segLocal, Target: segRemote, Length: 4096})
		if k, err := a.t.Submit(gone); k != 1 || err != nil {
			t.Fatalf("Submit = %d, %v", k, err)
		}
		r.wait(t, 1)
		if !errors.Is(r.errs[gone[0]], ErrNotRegistered) {
			t.Fatalf("%v from a removed local segment: %v, want ErrNotRegistered", op, fmt.Sprint(r.errs[gone[0]]))
		}
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(rb)
}
