package xfer_test

import (
	"errors"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// notMemory is a segment without a mapping, as a file is.
type notMemory struct{ xfer.Segment }

// remoteTo routes every request to a peer's segment to tr.
type remoteTo struct{ tr xfer.Transport }

func (r remoteTo) Route(local, target xfer.Segment) xfer.Transport { return r.tr }

// TestKindRouter: memory goes to Mem, files to File, peers' segments where
// Remote says; a kind with no transport, and a local side that is not
// memory, are refused with their categories.
func TestKindRouter(t *testing.T) {
	mem, file, peer := xfertest.New(xfertest.Config{Name: "mem"}), xfertest.New(xfertest.Config{Name: "file"}),
		xfertest.New(xfertest.Config{Name: "peer"})
	pool := xfertest.SegmentOf(1, xfer.KindPool, nil)
	client := xfertest.SegmentOf(2, xfer.KindClient, nil)
	f := notMemory{xfertest.SegmentOf(3, xfer.KindFile, nil)}
	remote := xfertest.SegmentOf(4, xfer.KindRemote, nil)
	full := xfer.KindRouter{Mem: mem, File: file, Remote: remoteTo{peer}}
	for _, c := range []struct {
		name          string
		r             xfer.KindRouter
		local, target xfer.Segment
		want          xfer.Transport
		err           error
	}{
		{"pool to client", full, pool, client, mem, nil},
		{"client to pool", full, client, pool, mem, nil},
		{"to a file", full, pool, f, file, nil},
		{"to a peer", full, client, remote, peer, nil},
		{"from a file", full, f, pool, nil, xfer.ErrInvalid},
		{"to a file without a file transport", xfer.KindRouter{Mem: mem}, pool, f, nil, xfer.ErrNotSupported},
		{"to a peer without a peer plane", xfer.KindRouter{Mem: mem}, pool, remote, nil, xfer.ErrNotSupported},
	} {
		tr, err := c.r.Route(c.local, c.target)
		if c.err != nil {
			if !errors.Is(err, c.err) || tr != nil {
				t.Errorf("%s: %v, %v; want %v", c.name, tr, err, c.err)
			}
			continue
		}
		if err != nil || tr != c.want {
			t.Errorf("%s: %v, %v; want %s", c.name, tr, err, c.want.Name())
		}
	}
}
