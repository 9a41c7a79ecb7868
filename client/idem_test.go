package client

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// waitConns waits until the daemon serves n connections (a closed one
// counts until it released what it held).
func (d *daemon) waitConns(t testing.TB, n int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() bool { return d.srv.Connections() == n },
		"%d connections (now %v)", n, testutil.Lazy(d.srv.Connections))
}

// TestIdempotencyAcrossConnections: an idempotency key is bound, daemon
// wide, to the lane and arguments of its first use. Another connection
// presenting it under another lane is refused, and so is the same call
// while the first connection lives (its answer names that connection's
// blocks); the first connection's retry replays its answer. Once the
// first connection closed, the same call runs afresh elsewhere, and the
// key still refuses another lane.
func TestIdempotencyAcrossConnections(t *testing.T) {
	d := startDaemon(t)
	c1, err := Dial(d.sock, Options{NoPool: true, Lane: "stream-first"})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2, err := Dial(d.sock, Options{NoPool: true, Lane: "catalog-first"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()

	key := WithIdempotencyKey("prefill-7")
	first, err := c1.AllocBlocks(nil, 2, 4096, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.AllocBlocks(nil, 2, 4096, key); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("same key under another lane on another connection: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := c2.AllocBlocks(nil, 2, 4096, key, WithLane("stream-first")); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("same call on another connection while the first lives: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := c2.AllocBlocks(nil, 3, 4096, key, WithLane("stream-first")); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("same key and lane, other arguments, on another connection: %v, want FAILED_PRECONDITION", err)
	}
	again, err := c1.AllocBlocks(nil, 2, 4096, key)
	if err != nil || !slices.Equal(again, first) {
		t.Fatalf("the first connection's retry: %v %v, want its answer %v again", again, err, first)
	}
	if n := d.pool.Stats().Blocks; n != 2 {
		t.Fatalf("%d blocks allocated, want the first call's 2 only", n)
	}

	c1.Close()
	d.waitConns(t, 1)
	rerun, err := c2.AllocBlocks(nil, 2, 4096, key, WithLane("stream-first"))
	if err != nil || len(rerun) != 2 {
		t.Fatalf("same call after the first connection closed: %v %v, want a fresh run", rerun, err)
	}
	if _, err := c2.AllocBlocks(nil, 2, 4096, key); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("the key under another lane after its first owner closed: %v, want FAILED_PRECONDITION", err)
	}
	if replay, err := c2.AllocBlocks(nil, 2, 4096, key, WithLane("stream-first")); err != nil || !slices.Equal(replay, rerun) {
		t.Fatalf("retry of the rerun: %v %v, want %v", replay, err, rerun)
	}
	if n := d.pool.Stats().Blocks; n != 2 {
		t.Fatalf("%d blocks allocated, want the rerun's 2 only", n)
	}
}
