package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

func TestExchange(t *testing.T) {
	nodes := cluster(t, []string{"alpha", "bravo"}, 1<<20, Config{ConnsPerPeer: 2})
	a, b := nodes[0], nodes[1]
	var calls atomic.Int64
	// echo answers with the caller's identity and the request reversed.
	echo := func(from string, epoch uint64, req []byte) ([]byte, error) {
		calls.Add(1)
		out := []byte(fmt.Sprintf("%s/%x:", from, epoch))
		for i := len(req) - 1; i >= 0; i-- {
			out = append(out, req[i])
		}
		return out, nil
	}
	if err := b.Handle("echo", echo); err != nil {
		t.Fatal(err)
	}
	if err := b.Handle("fail", func(string, uint64, []byte) ([]byte, error) {
		return nil, errors.New("queue pair 3 is not there")
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Handle("big", func(string, uint64, []byte) ([]byte, error) {
		return make([]byte, MaxExchange+1), nil
	}); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	if err := b.Handle("slow", func(string, uint64, []byte) ([]byte, error) {
		<-release
		return []byte("late"), nil
	}); err != nil {
		t.Fatal(err)
	}

	resp, err := a.Exchange("bravo", "echo", []byte("abc"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("alpha/%x:cba", a.Epoch()); string(resp) != want {
		t.Fatalf("echo = %q, want %q", resp, want)
	}

	// The largest body goes both ways.
	big := bytes.Repeat([]byte("0123456789abcdef"), MaxExchange/16)
	big = big[:MaxExchange-len(fmt.Sprintf("alpha/%x:", a.Epoch()))]
	resp, err = a.Exchange("bravo", "echo", big, time.Second)
	if err != nil {
		t.Fatalf("echo of %d bytes: %v", len(big), err)
	}
	if len(resp) != MaxExchange || resp[len(resp)-1] != big[0] {
		t.Fatalf("echo of %d bytes answered %d bytes", len(big), len(resp))
	}

	if _, err := a.Exchange("bravo", "echo", make([]byte, MaxExchange+1), time.Second); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("oversized request: %v, want ErrInvalid", err)
	}
	for _, kind := range []string{"", strings.Repeat("k", MaxExchangeKind+1)} {
		if _, err := a.Exchange("bravo", kind, nil, time.Second); !errors.Is(err, xfer.ErrInvalid) {
			t.Fatalf("kind %q: %v, want ErrInvalid", kind, err)
		}
		if err := a.Handle(kind, echo); !errors.Is(err, xfer.ErrInvalid) {
			t.Fatalf("Handle(%q): %v, want ErrInvalid", kind, err)
		}
	}
	if _, err := a.Exchange("nobody", "echo", nil, time.Second); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("unknown peer: %v", err)
	}
	if _, err := a.Exchange("alpha", "echo", nil, time.Second); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("exchange with self: %v", err)
	}
	// Not served, and told apart from a failure of a handler (the store
	// across hosts sends a member of an older release the kind it knows
	// on xfer.ErrNotSupported).
	if _, err := a.Exchange("bravo", "rdma", nil, time.Second); !errors.Is(err, ErrNoHandler) || !errors.Is(err, xfer.ErrNotSupported) {
		t.Fatalf("no handler: %v, want ErrNoHandler, an xfer.ErrNotSupported", err)
	}
	_, err = a.Exchange("bravo", "fail", nil, time.Second)
	if !errors.Is(err, ErrExchange) || !strings.Contains(err.Error(), "queue pair 3 is not there") {
		t.Fatalf("failing handler: %v, want ErrExchange with the reason", err)
	}
	if _, err := a.Exchange("bravo", "big", nil, time.Second); !errors.Is(err, ErrExchange) {
		t.Fatalf("oversized answer: %v, want ErrExchange", err)
	}
	b.logs.waitContains(t, "exchange handler answered too much")

	// A timed-out exchange leaves the session usable: its late answer is
	// dropped, not taken for a protocol violation.
	start := time.Now()
	if _, err := a.Exchange("bravo", "slow", nil, 100*time.Millisecond); !errors.Is(err, xfer.ErrTimeout) {
		t.Fatalf("slow handler: %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("timeout of 100ms took %v", d)
	}
	// a remembers the timed-out request until its late answer comes; the
	// answer comes once the handler returns.
	pa := a.peer("bravo", false)
	lateDue := func() int {
		pa.mu.Lock()
		defer pa.mu.Unlock()
		n := 0
		for _, c := range pa.sess {
			n += len(c.timedOut)
		}
		return n
	}
	if n := lateDue(); n != 1 {
		t.Fatalf("%d late answers awaited after one exchange timed out, want 1", n)
	}
	close(release)
	testutil.Eventually(t, 5*time.Second, func() bool { return lateDue() == 0 },
		"the late answer arriving (%v still awaited)", testutil.Lazy(lateDue))
	before := calls.Load()
	if _, err := a.Exchange("bravo", "echo", []byte("x"), time.Second); err != nil {
		t.Fatalf("exchange after a timeout: %v", err)
	}
	if calls.Load() != before+1 {
		t.Fatalf("handler calls %d → %d", before, calls.Load())
	}
	if strings.Contains(a.logs.String(), "dropping peer connection") {
		t.Fatalf("a late answer dropped the connection:\n%s", a.logs.String())
	}

	// Pinned to the peer's epoch: the right one works, another is stale
	// and the handler does not run.
	before = calls.Load()
	if _, err := a.ExchangeAt("bravo", b.Epoch(), "echo", []byte("y"), time.Second); err != nil {
		t.Fatalf("exchange at the peer's epoch: %v", err)
	}
	if _, err := a.ExchangeAt("bravo", b.Epoch()+1, "echo", []byte("y"), time.Second); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("exchange at another epoch: %v, want ErrStaleEpoch", err)
	}
	if calls.Load() != before+1 {
		t.Fatalf("handler ran %d times for one current and one stale exchange", calls.Load()-before)
	}

	// Removing the handler turns it off.
	if err := b.Handle("echo", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exchange("bravo", "echo", nil, time.Second); !errors.Is(err, ErrNoHandler) {
		t.Fatalf("removed handler: %v, want ErrNoHandler", err)
	}
}

// TestExchangeCloseWaitsForHandlers: Close returns only after the running
// handlers did, and the requester sees its exchange fail, not hang.
func TestExchangeCloseWaitsForHandlers(t *testing.T) {
	nodes := cluster(t, []string{"alpha", "bravo"}, 1<<20, Config{ConnsPerPeer: 1})
	a, b := nodes[0], nodes[1]
	entered := make(chan struct{})
	var finished atomic.Bool
	if err := b.Handle("hold", func(string, uint64, []byte) ([]byte, error) {
		close(entered)
		time.Sleep(200 * time.Millisecond)
		finished.Store(true)
		return []byte("ok"), nil
	}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := a.Exchange("bravo", "hold", nil, 5*time.Second)
		errc <- err
	}()
	<-entered
	b.Close()
	if !finished.Load() {
		t.Fatal("Close returned while a handler was running")
	}
	select {
	case err := <-errc:
		// The answer may have made it out before the connection closed.
		if err != nil && !errors.Is(err, ErrConnLost) {
			t.Fatalf("exchange with a closing peer: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("exchange with a closed peer did not end")
	}
}

// TestExchangeFrames: exchange frames parse, and their near misses fail.
func TestExchangeFrames(t *testing.T) {
	good, bad := exchangeSeedFrames()
	for i, b := range good {
		if _, err := parseFrame(b, fuzzLimits); err != nil {
			t.Errorf("exchange seed %d: %v", i, err)
		}
	}
	for i, b := range bad {
		if _, err := parseFrame(b, fuzzLimits); err == nil {
			t.Errorf("exchange near miss %d parsed", i)
		}
	}
}

// TestExchangeBusy: at most MaxExchangeHandlers run at once; one more is
// answered "busy" at once, and room comes back when they finish.
func TestExchangeBusy(t *testing.T) {
	nodes := cluster(t, []string{"alpha", "bravo"}, 1<<20, Config{ConnsPerPeer: 2})
	a, b := nodes[0], nodes[1]
	entered, release := holdingHandler(t, b, "hold", []byte("done"), MaxExchangeHandlers)
	errs := make(chan error, MaxExchangeHandlers)
	for range MaxExchangeHandlers {
		go func() {
			_, err := a.Exchange("bravo", "hold", nil, 5*time.Second)
			errs <- err
		}()
	}
	for range MaxExchangeHandlers {
		select {
		case <-entered:
		case <-time.After(5 * time.Second):
			t.Fatal("handlers did not start")
		}
	}
	_, err := a.Exchange("bravo", "hold", nil, time.Second)
	if !errors.Is(err, ErrExchange) || !errors.Is(err, ErrPeerBusy) || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("exchange beyond the bound: %v, want ErrExchange and ErrPeerBusy", err)
	}
	close(release)
	for range MaxExchangeHandlers {
		if err := <-errs; err != nil {
			t.Fatalf("held exchange: %v", err)
		}
	}
	if resp, err := a.Exchange("bravo", "hold", nil, time.Second); err != nil || string(resp) != "done" {
		t.Fatalf("exchange after the handlers finished: %q, %v", resp, err)
	}
}

// TestExchangeRoomFreeByTheAnswer: a handler's room is free by the time
// its answer reaches the peer, so a peer that has its answer and at once
// sends MaxExchangeHandlers exchanges gets all of them run, none "busy".
// The answered exchange's goroutine is held here after its answer is
// queued, where a room freed only on the goroutine's way out would still
// be taken.
func TestExchangeRoomFreeByTheAnswer(t *testing.T) {
	nodes := cluster(t, []string{"alpha", "bravo"}, 1<<20, Config{ConnsPerPeer: 2})
	a, b := nodes[0], nodes[1]
	if err := b.Handle("quick", func(string, uint64, []byte) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		t.Fatal(err)
	}
	after, let := make(chan struct{}, 1), make(chan struct{})
	hook := func() {
		select {
		case after <- struct{}{}:
			<-let
		default:
		}
	}
	exchAnswered.Store(&hook)
	t.Cleanup(func() { exchAnswered.Store(nil) })
	var once sync.Once
	letGo := func() { once.Do(func() { close(let) }) }
	t.Cleanup(letGo)

	if resp, err := a.Exchange("bravo", "quick", nil, 5*time.Second); err != nil || string(resp) != "ok" {
		t.Fatalf("quick exchange: %q, %v", resp, err)
	}
	select {
	case <-after: // the quick exchange's goroutine is held past its answer
	case <-time.After(5 * time.Second):
		t.Fatal("the quick exchange's goroutine never reached its answer")
	}
	entered, release := holdingHandler(t, b, "hold", []byte("done"), MaxExchangeHandlers)
	var relOnce sync.Once
	letHandlersGo := func() { relOnce.Do(func() { close(release) }) }
	t.Cleanup(letHandlersGo)
	errs := make(chan error, MaxExchangeHandlers)
	for range MaxExchangeHandlers {
		go func() {
			_, err := a.Exchange("bravo", "hold", nil, 5*time.Second)
			errs <- err
		}()
	}
	for i := range MaxExchangeHandlers {
		select {
		case <-entered:
		case err := <-errs:
			t.Fatalf("exchange %d of %d, sent once the quick one was answered: %v", i+1, MaxExchangeHandlers, err)
		case <-time.After(5 * time.Second):
			t.Fatal("handlers did not start")
		}
	}
	letHandlersGo()
	letGo()
	for range MaxExchangeHandlers {
		if err := <-errs; err != nil {
			t.Fatalf("held exchange: %v", err)
		}
	}
}

// TestExchangeTimeoutCoversTheDial: an exchange with a peer that accepts
// connections and never answers the handshake (a stopped process: its
// kernel still accepts) ends by the exchange's own timeout, with
// xfer.ErrTimeout, not after the node's HandshakeTimeout.
func TestExchangeTimeoutCoversTheDial(t *testing.T) {
	kf := testutil.KeyFile(t, t.TempDir(), "k", "secret")
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf, HandshakeTimeout: 10 * time.Second})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() }) // accepted by the kernel, never read
	_ = a.Directory().Update(dirPeer("stopped", ln.Addr().String()))
	start := time.Now()
	_, err = a.Exchange("stopped", "echo", nil, 300*time.Millisecond)
	if el := time.Since(start); !errors.Is(err, xfer.ErrTimeout) || el > 3*time.Second {
		t.Fatalf("exchange with a peer that never handshakes: %v after %v; want ErrTimeout within its 300ms (the handshake's is 10s)", err, el)
	}
}

// TestNestedHandlersApart: two nodes whose handlers of one kind each make
// an exchange of their own to the other and wait on it (a removal at its
// home waiting on a drop at the holder) run those handlers under a bound
// apart (HandleNested). With every one of them taken on both nodes at
// once, the exchanges they wait on are still served (with one bound, each
// node's were all taken by handlers waiting on the other, and those
// exchanges came back busy); one nested exchange beyond its bound is
// answered busy.
func TestNestedHandlersApart(t *testing.T) {
	nodes := cluster(t, []string{"alpha", "bravo"}, 1<<20, Config{ConnsPerPeer: 2})
	other := map[string]string{"alpha": "bravo", "bravo": "alpha"}
	entered := map[string]chan struct{}{}
	full := map[string]chan struct{}{}
	for _, n := range nodes {
		id := n.ID()
		entered[id], full[id] = make(chan struct{}, MaxExchangeHandlers), make(chan struct{})
		if err := n.Handle("drop", func(string, uint64, []byte) ([]byte, error) { return []byte("dropped"), nil }); err != nil {
			t.Fatal(err)
		}
		if err := n.HandleNested("remove", func(string, uint64, []byte) ([]byte, error) {
			entered[id] <- struct{}{}
			<-full[id] // every nested handler of this node is taken
			return n.Exchange(other[id], "drop", nil, 5*time.Second)
		}); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, 2*MaxExchangeHandlers)
	for _, n := range nodes {
		for range MaxExchangeHandlers {
			go func() {
				resp, err := n.Exchange(other[n.ID()], "remove", nil, 5*time.Second)
				if err == nil && string(resp) != "dropped" {
					err = fmt.Errorf("answer %q", resp)
				}
				errs <- err
			}()
		}
	}
	for _, n := range nodes {
		for range MaxExchangeHandlers {
			select {
			case <-entered[n.ID()]:
			case <-time.After(5 * time.Second):
				t.Fatalf("the nested handlers of %s did not all start", n.ID())
			}
		}
	}
	_, err := nodes[0].Exchange("bravo", "remove", nil, time.Second)
	if !errors.Is(err, ErrPeerBusy) {
		t.Fatalf("a nested exchange beyond its bound: %v, want ErrPeerBusy", err)
	}
	for _, n := range nodes {
		close(full[n.ID()])
	}
	for range 2 * MaxExchangeHandlers {
		if err := <-errs; err != nil {
			t.Errorf("a nested exchange, every nested handler of both nodes taken: %v", err)
		}
	}
}
