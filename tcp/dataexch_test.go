package tcp

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

type dataAnswer struct {
	resp []byte
	got  int
	err  error
}

// TestExchangeInto: a data exchange's answer brings its payload straight
// into the asker's buffer in one round trip; a kind without an inline
// handler and a failed handler answer errors; without a session the call
// fails at once; an answer that comes after the deadline ends the
// exchange with ErrTimeout and its payload never touches the buffer,
// and the connection goes on serving.
func TestExchangeInto(t *testing.T) {
	nodes := cluster(t, []string{"alpha", "bravo"}, 1<<20, Config{ConnsPerPeer: 1})
	a, b := nodes[0], nodes[1]
	value := make([]byte, 256<<10)
	for i := range value {
		value[i] = byte(i * 7)
	}
	hold := make(chan struct{})
	if err := b.HandleInline("value", func(from string, epoch uint64, req []byte, reply func(resp, payload []byte)) error {
		switch string(req) {
		case "slow":
			<-hold // blocks bravo's event loop: only this test does that
		case "fail":
			return errors.New("no such value")
		}
		reply(append([]byte(from+":"), req...), value[:len(value)-len(req)])
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ask := func(req string, dst []byte, d time.Duration) (dataAnswer, error) {
		ch := make(chan dataAnswer, 1)
		err := a.ExchangeInto("bravo", b.Epoch(), "value", []byte(req), dst, time.Now().Add(d),
			func(resp []byte, got int, err error) { ch <- dataAnswer{resp, got, err} })
		if err != nil {
			return dataAnswer{}, err
		}
		return <-ch, nil
	}
	// No session yet: it fails at once instead of dialing.
	if _, err := ask("x", make([]byte, 16), time.Second); !errors.Is(err, ErrConnLost) {
		t.Fatalf("without a session: %v, want ErrConnLost", err)
	}
	if _, err := a.Exchange("bravo", "none", nil, time.Second); !errors.Is(err, ErrNoHandler) {
		t.Fatalf("opening the session: %v", err)
	}
	dst := make([]byte, len(value))
	r, err := ask("ab", dst, 5*time.Second)
	if err != nil || r.err != nil {
		t.Fatal(err, r.err)
	}
	if string(r.resp) != "alpha:ab" || r.got != len(value)-2 || !bytes.Equal(dst[:r.got], value[:r.got]) {
		t.Fatalf("answer %q with %d bytes, want %q and %d bytes of the value", r.resp, r.got, "alpha:ab", len(value)-2)
	}
	if r, err := ask("fail", dst, 5*time.Second); err != nil || !errors.Is(r.err, ErrExchange) {
		t.Fatalf("failing handler: %v %v, want ErrExchange", err, r.err)
	}
	if err := a.ExchangeInto("bravo", 0, "nothing", nil, dst, time.Now().Add(time.Second), func(_ []byte, _ int, err error) {
		if !errors.Is(err, ErrNoHandler) {
			t.Errorf("kind without a handler: %v, want ErrNoHandler", err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if r, err := ask("ab", dst, 5*time.Second); err != nil || r.err != nil {
		t.Fatal(err, r.err)
	}
	// Addressed to another run of bravo: refused, nothing served.
	ch := make(chan error, 1)
	if err := a.ExchangeInto("bravo", b.Epoch()+1, "value", []byte("ab"), dst, time.Now().Add(time.Second),
		func(_ []byte, _ int, err error) { ch <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-ch; !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("another epoch: %v, want ErrStaleEpoch", err)
	}

	// Late: the deadline passes while bravo's loop is held.
	late := make([]byte, len(value))
	r, err = ask("slow", late, 50*time.Millisecond)
	close(hold)
	if err != nil || !errors.Is(r.err, xfer.ErrTimeout) || r.got != 0 {
		t.Fatalf("late answer: %v %+v, want ErrTimeout", err, r)
	}
	// The next answer on the same connection comes after the late one,
	// which was read and dropped.
	if r, err := ask("ab", dst, 5*time.Second); err != nil || r.err != nil {
		t.Fatalf("after a late answer: %v %v", err, r.err)
	}
	if !bytes.Equal(late, make([]byte, len(late))) {
		t.Fatal("a late answer's payload was written into the buffer after its exchange ended")
	}
	// Too much for the buffer: refused before sending.
	if err := a.ExchangeInto("bravo", 0, "value", nil, make([]byte, a.MaxDataPayload()+1), time.Now().Add(time.Second),
		func([]byte, int, error) {}); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("buffer over a data frame: %v, want ErrInvalid", err)
	}
}

// TestExchangeIntoWindow: a data exchange's payload counts against the
// flow-control window like a READ's: with the window full of answers not
// yet in, the next one fails at once with ErrWindowFull (the caller takes
// another way) instead of piling answers up at the peer, and once the
// answers are in, or an exchange timed out, its room is free again.
func TestExchangeIntoWindow(t *testing.T) {
	const size = 256 << 10
	nodes := cluster(t, []string{"alpha", "bravo"}, 1<<20, Config{ConnsPerPeer: 1, SliceSize: size, MaxInflightBytes: 4 * size})
	a, b := nodes[0], nodes[1]
	// A "wait" exchange holds bravo's event loop (the answers behind it
	// wait too) until release lets one go; the test's end lets any go,
	// or the nodes could not stop.
	gate := make(chan struct{}, 2)
	release := func() { gate <- struct{}{} }
	t.Cleanup(func() { close(gate) })
	value := make([]byte, size)
	if err := b.HandleInline("value", func(_ string, _ uint64, req []byte, reply func(resp, payload []byte)) error {
		if string(req) == "wait" {
			<-gate
		}
		reply(nil, value)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exchange("bravo", "none", nil, time.Second); !errors.Is(err, ErrNoHandler) {
		t.Fatalf("opening the session: %v", err)
	}
	ask := func(req string, d time.Duration) (chan dataAnswer, error) {
		ch := make(chan dataAnswer, 1)
		err := a.ExchangeInto("bravo", 0, "value", []byte(req), make([]byte, size), time.Now().Add(d),
			func(resp []byte, got int, err error) { ch <- dataAnswer{resp, got, err} })
		return ch, err
	}
	// fill sends a held exchange with deadline d, then three more.
	fill := func(d time.Duration) []chan dataAnswer {
		t.Helper()
		var chs []chan dataAnswer
		for i := range 4 {
			req, dl := "go", 5*time.Second
			if i == 0 {
				req, dl = "wait", d
			}
			ch, err := ask(req, dl)
			if err != nil {
				t.Fatalf("exchange %d of a window of 4: %v", i+1, err)
			}
			chs = append(chs, ch)
		}
		if _, err := ask("go", 5*time.Second); !errors.Is(err, ErrWindowFull) || !errors.Is(err, xfer.ErrBackpressure) {
			t.Fatalf("a fifth exchange with the window full: %v, want ErrWindowFull", err)
		}
		return chs
	}
	chs := fill(5 * time.Second)
	release()
	for i, ch := range chs {
		if r := <-ch; r.err != nil || r.got != size {
			t.Fatalf("exchange %d: %+v", i+1, r)
		}
	}
	// Their room is back: the window takes four again, one of which
	// times out (its room comes back with its end).
	chs = fill(50 * time.Millisecond)
	if r := <-chs[0]; !errors.Is(r.err, xfer.ErrTimeout) {
		t.Fatalf("the held exchange: %+v, want ErrTimeout", r)
	}
	ch, err := ask("go", 5*time.Second)
	if err != nil {
		t.Fatalf("after a timed-out exchange: %v, want its room back", err)
	}
	release()
	for _, c := range append(chs[1:], ch) {
		if r := <-c; r.err != nil || r.got != size {
			t.Fatalf("after the held one: %d bytes, %v", r.got, r.err)
		}
	}
}
