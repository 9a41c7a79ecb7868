package client

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// A transfer that its transport fails reaches the client with one code
// whichever path carries it, a queue's completion or the socket's answer,
// and that code is the transport error's category's: a lost peer
// connection is UNAVAILABLE (it was INTERNAL through a queue), a
// transport's full queue RESOURCE_EXHAUSTED (it was INTERNAL on both).
func TestTransportErrorCodes(t *testing.T) {
	failWith := func(err error) xfertest.Config {
		return xfertest.Config{Inline: true, Err: func(*xfer.Task) error { return err }}
	}
	refuseWith := func(err error) xfertest.Config {
		return xfertest.Config{Limit: -1, LimitErr: err}
	}
	for _, c := range []struct {
		name string
		cfg  xfertest.Config
		want wire.Code
	}{
		{"tcp connection lost", failWith(fmt.Errorf("%w: peer d-2 hung up", tcp.ErrConnLost)), tcproto.CodeUNAVAILABLE},
		{"rdma queue pair down", failWith(fmt.Errorf("%w: qp 3", rdma.ErrQPDown)), tcproto.CodeUNAVAILABLE},
		{"rdma work completion error", failWith(&rdma.CompletionError{Status: rdma.WCRetryExcErr, QP: 1}), tcproto.CodeUNAVAILABLE},
		{"uring queue full", refuseWith(uring.ErrQueueFull), tcproto.CodeRESOURCE_EXHAUSTED},
		{"rdma queue full", refuseWith(rdma.ErrQueueFull), tcproto.CodeRESOURCE_EXHAUSTED},
		{"tcp backlog", refuseWith(fmt.Errorf("%w: 64 tasks wait for peer d-2 already", tcp.ErrBacklog)), tcproto.CodeRESOURCE_EXHAUSTED},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := startDaemonOn(t, xfertest.New(c.cfg))
			cl, err := Dial(d.sock, Options{Name: "codes"})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			reqs := []xfer.Request{write4K(t, cl)}

			results := make([]error, 1)
			if _, err := cl.Transfer(reqs, 10*time.Second, results); err != nil {
				t.Fatal(err)
			}
			var se *StatusError
			if !errors.As(results[0], &se) || se.Code != c.want {
				t.Errorf("on the socket: %v, want %s", results[0], c.want)
			}

			q, err := cl.OpenQueue(8)
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			if n, err := q.Submit(reqs, []uint64{7}); n != 1 || err != nil {
				t.Fatalf("queue submit: %d, %v", n, err)
			}
			out := make([]Completion, 1)
			if n, err := q.Reap(out, 1, 10*time.Second); n != 1 || err != nil {
				t.Fatalf("queue reap: %d, %v", n, err)
			}
			if out[0].UserData != 7 || out[0].Code != c.want {
				t.Errorf("through a queue: completion %+v (%s), want %s", out[0], out[0].Code, c.want)
			}
		})
	}
}

// A code the protocol does not name (past INTERNAL) is a protocol
// violation wherever it comes: a call's status fails the call with
// ErrProtocol and closes the client; a per-item code, a completion's and a
// results region's call code are ErrProtocol, never a raw code.
func TestUnknownCodes(t *testing.T) {
	const unknown = tcproto.CodeINTERNAL + 1
	reqs := []xfer.Request{{Op: xfer.OpWrite, Local: 2, Target: 1, Length: 1}, {Op: xfer.OpWrite, Local: 2, Target: 1, Length: 1}}
	sock := fakeDaemon(t, func(m *wire.Request) wire.Response {
		if _, ok := m.Body.(*wire.SubmitRequest); ok {
			return wire.Response{Body: &wire.SubmitResponse{Codes: []wire.Code{tcproto.CodeOK, unknown}}}
		}
		return wire.Response{Status: unknown, Message: []byte("?")}
	})
	c, err := Dial(sock, Options{NoPool: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res := make([]error, 2)
	if err := c.Submit(1, reqs, res); err != nil || res[0] != nil || !errors.Is(res[1], ErrProtocol) {
		t.Fatalf("submit: %v, results %v; want item 1 ErrProtocol", err, res)
	}
	if err := c.Ping(nil); !errors.Is(err, ErrProtocol) {
		t.Fatalf("ping answered status %d: %v, want ErrProtocol", unknown, err)
	}
	if err := c.Ping(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("client still used after a status the protocol does not name: %v", err)
	}
	if err := (Completion{Code: unknown}).Err(); !errors.Is(err, ErrProtocol) {
		t.Fatalf("completion code %d: %v, want ErrProtocol", unknown, err)
	}
	if err := (Completion{Code: tcproto.CodeINTERNAL}).Err(); !errors.Is(err, ErrInternal) {
		t.Fatalf("completion code INTERNAL: %v, want ErrInternal", err)
	}
	// A queue's completion carries a u32: no code past INTERNAL reads as
	// one the protocol names once it is a Code.
	for _, raw := range []uint32{uint32(unknown), 0xff, 0x100 + uint32(tcproto.CodeNOT_FOUND), 1 << 31} {
		if err := (Completion{Code: completionCode(raw)}).Err(); !errors.Is(err, ErrProtocol) {
			t.Errorf("completion code %#x: %v, want ErrProtocol", raw, err)
		}
	}
	if c := completionCode(uint32(tcproto.CodeNOT_FOUND)); c != tcproto.CodeNOT_FOUND {
		t.Errorf("completion code NOT_FOUND read as %s", c)
	}
	r := &Results{}
	if err := r.Check(Completion{Code: unknown}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("results of a call with code %d: %v, want ErrProtocol", unknown, err)
	}
}

// A task state the protocol does not name is a protocol violation too: a
// TaskStatus answering one fails with ErrProtocol, and a queue completion
// carrying one reads as failed with ErrProtocol, never as a raw state a
// caller's switch would not know.
func TestUnknownStates(t *testing.T) {
	for _, raw := range []uint32{uint32(xfer.StateCanceled) + 1, 0xff} {
		sock := fakeDaemon(t, func(m *wire.Request) wire.Response {
			return wire.Response{Body: &wire.TaskStatusResponse{State: tcproto.TaskState(raw)}}
		})
		c, err := Dial(sock, Options{NoPool: true})
		if err != nil {
			t.Fatal(err)
		}
		if st, err := c.TaskStatus(1, 0); !errors.Is(err, ErrProtocol) {
			t.Errorf("task state %d: %+v, %v; want ErrProtocol", raw, st, err)
		}
		c.Close()
		if st, ok := completionState(raw); ok || st != xfer.StateFailed {
			t.Errorf("completion state %d: %v, %v; want failed and not one the protocol names", raw, st, ok)
		}
	}
	// 0 is a request's that never ran (refused before it started).
	for s := xfer.State(0); s <= xfer.StateCanceled; s++ {
		if st, ok := completionState(uint32(s)); !ok || st != s {
			t.Errorf("completion state %v read as %v, %v", s, st, ok)
		}
	}
}
