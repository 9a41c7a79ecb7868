package cluster

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
)

// gatedMover is a Mover whose Reads each wait for the test to let them
// land: it copies from src into the reader's pool, or fails with the
// error the test gives.
type gatedMover struct {
	src, dst []byte
	mu       sync.Mutex
	started  [][]Span // every Read's spans, in the order they started
	gates    []chan error
	inflight int
	most     int
}

func (m *gatedMover) Read(holder string, epoch uint64, spans []Span, deadline time.Time) error {
	gate := make(chan error, 1)
	m.mu.Lock()
	m.started = append(m.started, spans)
	m.gates = append(m.gates, gate)
	m.inflight++
	m.most = max(m.most, m.inflight)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.inflight--
		m.mu.Unlock()
	}()
	if err := <-gate; err != nil {
		return err
	}
	for _, s := range spans {
		copy(m.dst[s.Local:s.Local+s.Length], m.src[s.Remote:s.Remote+s.Length])
	}
	return nil
}

// land lets Read i land, with err.
func (m *gatedMover) land(i int, err error) {
	m.mu.Lock()
	g := m.gates[i]
	m.mu.Unlock()
	g <- err
}

func (m *gatedMover) counts() (started, inflight int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.started), m.inflight
}

// A large read from a holder goes in parts, at most readInFlight of them
// on the wire, taking their turns in order: the part after the first four
// starts as soon as one of them lands, while the other three are still on
// the wire. Every span is read once, its checksum is its bytes', and a part
// that fails fails its own spans only.
func TestReadCheckedPipelinesParts(t *testing.T) {
	const n, size = 32, 1 << 20 // 32 MiB: readPartsMax parts of 2 MiB
	src := make([]byte, n*size)
	for i := 0; i < len(src); i += 8 {
		binary.LittleEndian.PutUint64(src[i:], rand.Uint64())
	}
	m := &gatedMover{src: src, dst: make([]byte, n*size)}
	c := &Cluster{cfg: Config{Pool: m.dst}, mover: m}
	spans := make([]Span, n)
	for i := range spans {
		// The value of span i lands at the mirror place: a mix-up shows.
		spans[i] = Span{Local: uint64(n-1-i) * size, Remote: uint64(i) * size, Length: size}
	}
	type result struct {
		sums []uint32
		errs []error
	}
	done := make(chan result, 1)
	go func() {
		sums, errs := c.readChecked("h", 1, spans, time.Now().Add(time.Minute))
		done <- result{sums, errs}
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { s, in := m.counts(); return s == readInFlight && in == readInFlight },
		"the first %d parts on the wire (started, in flight: %v)", readInFlight, testutil.Lazy(func() []int { s, in := m.counts(); return []int{s, in} }))
	m.land(1, nil)
	testutil.Eventually(t, 10*time.Second, func() bool { s, in := m.counts(); return s == readInFlight+1 && in == readInFlight },
		"a fifth part started once the second landed, the other three still on the wire")
	failed := errors.New("the holder went away")
	m.land(0, failed)
	for i := 2; i < readPartsMax; i++ {
		// Land the next one only once every part that may be on the wire
		// is, so that each later part starts alone.
		want := min(i+readInFlight, readPartsMax)
		testutil.Eventually(t, 10*time.Second, func() bool { s, _ := m.counts(); return s == want },
			"%d parts started", want)
		m.land(i, nil)
	}
	r := <-done
	if s, _ := m.counts(); s != readPartsMax || m.most != readInFlight {
		t.Fatalf("%d parts, %d at most in flight; want %d and %d", s, m.most, readPartsMax, readInFlight)
	}
	// Parts take their slots in order; the first four may reach Read in
	// any order, and each later one starts alone here, once one lands.
	part := func(i int) int { // the part Read i moved, by its first span
		for j := range spans {
			if spans[j] == m.started[i][0] {
				return j / len(m.started[i])
			}
		}
		t.Fatalf("Read %d moved span %+v, which is none of the read's", i, m.started[i][0])
		return -1
	}
	seen := map[int]bool{}
	moved := 0
	for i := range m.started {
		p := part(i)
		if seen[p] || i < readInFlight && p >= readInFlight || i >= readInFlight && p != i {
			t.Fatalf("Read %d moved part %d: parts out of order", i, p)
		}
		seen[p] = true
		for k, sp := range m.started[i] {
			if want := spans[p*len(m.started[i])+k]; sp != want {
				t.Fatalf("Read %d moves %+v, want %+v", i, sp, want)
			}
		}
		moved += len(m.started[i])
	}
	if moved != n {
		t.Fatalf("the parts read %d spans, want %d", moved, n)
	}
	failedPart := map[Span]bool{}
	for _, sp := range m.started[0] {
		failedPart[sp] = true
	}
	for j, sp := range spans {
		switch {
		case failedPart[sp]:
			if !errors.Is(r.errs[j], failed) {
				t.Errorf("span %d of the failed part: %v, want its error", j, r.errs[j])
			}
		case r.errs[j] != nil:
			t.Errorf("span %d: %v", j, r.errs[j])
		case r.sums[j] != store.CRC(src[sp.Remote:sp.Remote+sp.Length]):
			t.Errorf("span %d: crc32c %#x is not its value's", j, r.sums[j])
		}
	}
}
