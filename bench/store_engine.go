package bench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
)

func init() {
	engines["store"] = newStoreEngine
	delete(unavailable, "store")
}

// storeEngine runs a job as a client of tensorcastd's KV block store, on
// one connection and one queue per clone: the target region is blocks of
// bs bytes, each a key. A write is a zero-copy put through the queue
// (Reserve, the client's bytes written in place in the pool, Commit;
// durable=1 answers once on L2); a read is a Get through the queue (pin,
// the value read in place into the client's buffer, Unpin). The IOs of one
// Submit call that share an op and length go in one store call of that
// many keys, so batch sets the keys per call.
//
// Keys are the block's offset and a sequence number: a store key is
// written once, so every write makes a new key for its block, a read reads
// the latest one that completed, and keys superseded are removed in
// batches on the socket (a long write job would otherwise fill L1 with
// values nobody reads).
type storeEngine struct {
	env  *Env
	job  *Job
	spec EngineSpec

	c       *client.Client
	q       *client.Queue
	prefix  []byte
	slotMem [][]byte // per slot: the client's buffer

	// gens[b] is the sequence of block b's latest write that completed, 0
	// before its first; seq numbers every write.
	gens []uint64
	seq  uint64

	calls   []storeIOCall
	free    []int
	backlog []int // calls whose next entry found no room in the queue yet
	cqes    []client.Completion
	ready   []Completion
	pending int // IOs submitted, not in ready yet
	stale   []staleKey
	l2      bool // the daemon's store has an L2: prefill durably
	rmKeys  [][]byte
	rmBuf   []byte
	rmRes   []error
	closed  bool
}

// storeIOCall is one store call in flight: the IOs it carries, their keys
// and where its results land, and the step it is at.
type storeIOCall struct {
	res    *client.Results
	ios    []IO
	seqs   []uint64
	errs   []error
	keyBuf []byte
	keys   [][]byte
	ok     [][]byte // the keys whose Get succeeded, to Unpin
	step   uint8
}

// Steps of a store call; a completion's user data is call<<2 | step.
const (
	stepReserve uint8 = iota
	stepCommit
	stepGet
	stepUnpin
)

type staleKey struct{ off, seq uint64 }

// staleBatch is how many superseded keys are removed in one socket call.
const staleBatch = 256

var _ Engine = (*storeEngine)(nil)
var _ Peeker = (*storeEngine)(nil)
var _ Prefiller = (*storeEngine)(nil)

func newStoreEngine(env *Env, job *Job) (Engine, error) {
	return &storeEngine{env: env, job: job}, nil
}

func (s *storeEngine) Name() string { return "store" }

func (s *storeEngine) Open(spec EngineSpec) (err error) {
	if s.c != nil {
		return fmt.Errorf("%w: engine opened twice", ErrBadValue)
	}
	j := s.job
	if j.BSMin != j.BSMax || spec.Region%j.BSMax != 0 {
		return fmt.Errorf("%w: engine store needs one bs that divides size (a key is one block)", ErrBadValue)
	}
	s.spec = spec
	c, err := client.Dial(s.env.socket(j), client.Options{Name: "tcbench-store"})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrEngineUnavailable, err)
	}
	s.c = c
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	nonce := make([]byte, 6)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	// A prefix of its own per run and clone: earlier runs' keys never
	// collide with this one's.
	s.prefix = fmt.Appendf(nil, "tcbench/%s/%s/%d/", hex.EncodeToString(nonce), j.Name, spec.Worker)
	ncalls := spec.Slots
	if s.q, err = c.OpenQueue(min(max(ncalls, 2), 4096)); err != nil {
		return fmt.Errorf("%w: open a queue: %w", ErrEngineUnavailable, err)
	}
	per := j.Batch
	buf, err := c.RegisterBuffer(uint64(ncalls*per) * 16)
	if err != nil {
		return fmt.Errorf("results buffer: %w", err)
	}
	keyLen := len(s.prefix) + 2*16 + 1
	s.calls = make([]storeIOCall, ncalls)
	s.free = make([]int, ncalls)
	for i := range s.calls {
		cl := &s.calls[i]
		if cl.res, err = c.ResultsIn(buf, uint64(i*per)*16, per); err != nil {
			return err
		}
		cl.ios = make([]IO, 0, per)
		cl.seqs = make([]uint64, per)
		cl.errs = make([]error, per)
		cl.keyBuf = make([]byte, 0, per*keyLen)
		cl.keys = make([][]byte, 0, per)
		cl.ok = make([][]byte, 0, per)
		s.free[i] = ncalls - 1 - i
	}
	s.slotMem = make([][]byte, spec.Slots)
	for i := range s.slotMem {
		s.slotMem[i] = make([]byte, spec.SlotSize)
	}
	s.gens = make([]uint64, spec.Region/j.BSMax)
	s.backlog = make([]int, 0, ncalls)
	s.cqes = make([]client.Completion, ncalls)
	s.ready = make([]Completion, 0, spec.Slots)
	s.rmKeys = make([][]byte, 0, staleBatch)
	s.rmBuf = make([]byte, 0, staleBatch*keyLen)
	s.rmRes = make([]error, staleBatch)
	st, err := c.Stats()
	if err != nil {
		return err
	}
	for _, k := range st.Store {
		if k.Name == "l2_capacity" {
			s.l2 = k.Value > 0
		}
	}
	if len(st.Store) == 0 {
		return fmt.Errorf("%w: the daemon runs no store (store = off)", ErrEngineUnavailable)
	}
	return nil
}

func (s *storeEngine) Buffer(slot int) []byte { return s.slotMem[slot] }

// Synchronous: Submit only queues; the calls complete in the daemon.
func (s *storeEngine) Synchronous() bool { return false }

// appendKey appends block off's key of sequence seq.
func (s *storeEngine) appendKey(dst []byte, off, seq uint64) []byte {
	dst = append(dst, s.prefix...)
	dst = strconv.AppendUint(dst, off, 16)
	dst = append(dst, '.')
	return strconv.AppendUint(dst, seq, 16)
}

func (s *storeEngine) Submit(ios []IO) (int, error) {
	if s.q == nil || s.closed {
		return 0, fmt.Errorf("%w: engine not open", ErrBadValue)
	}
	bs := s.job.BSMax
	n := 0
	for n < len(ios) {
		if len(s.free) == 0 {
			break
		}
		io := ios[n]
		if io.Slot < 0 || io.Slot >= len(s.slotMem) || io.Length == 0 || io.Length > bs || io.Offset%bs != 0 ||
			io.Offset >= s.spec.Region || (io.Op != OpRead && io.Op != OpWrite) {
			return n, fmt.Errorf("%w: request out of bounds or not on a block", ErrBadValue)
		}
		ci := s.free[len(s.free)-1]
		s.free = s.free[:len(s.free)-1]
		cl := &s.calls[ci]
		cl.ios, cl.keys, cl.keyBuf = cl.ios[:0], cl.keys[:0], cl.keyBuf[:0]
		// One call: the IOs from here on with this op and length, at most
		// what its results region holds.
		for n < len(ios) && len(cl.ios) < cl.res.Cap() && ios[n].Op == io.Op && ios[n].Length == io.Length &&
			ios[n].Offset%bs == 0 && ios[n].Offset < s.spec.Region && ios[n].Slot >= 0 && ios[n].Slot < len(s.slotMem) {
			x := ios[n]
			k := len(cl.ios)
			seq := s.gens[x.Offset/bs]
			if x.Op == OpWrite {
				s.seq++
				seq = s.seq
			}
			cl.seqs[k], cl.errs[k] = seq, nil
			start := len(cl.keyBuf)
			cl.keyBuf = s.appendKey(cl.keyBuf, x.Offset, seq)
			cl.keys = append(cl.keys, cl.keyBuf[start:len(cl.keyBuf):len(cl.keyBuf)])
			cl.ios = append(cl.ios, x)
			n++
		}
		cl.step = stepGet
		if io.Op == OpWrite {
			cl.step = stepReserve
		}
		s.pending += len(cl.ios)
		if err := s.stage(ci); err != nil {
			return n, err
		}
	}
	return n, nil
}

// stage submits call ci's current step, or puts it on the backlog when the
// queue has no room for it now.
func (s *storeEngine) stage(ci int) error {
	cl := &s.calls[ci]
	ud := uint64(ci)<<2 | uint64(cl.step)
	var ok bool
	var err error
	switch cl.step {
	case stepReserve:
		ok, err = s.q.Reserve(cl.keys, cl.ios[0].Length, cl.res, ud)
	case stepCommit:
		ok, err = s.q.Commit(cl.keys, s.job.Durable, cl.res, ud)
	case stepGet:
		ok, err = s.q.Get(cl.keys, cl.res, ud)
	case stepUnpin:
		ok, err = s.q.Unpin(cl.ok, cl.res, ud)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrIO, err)
	}
	if !ok {
		s.backlog = append(s.backlog, ci)
	}
	return nil
}

// flush stages what the backlog holds, as far as the queue has room.
func (s *storeEngine) flush() error {
	b := s.backlog
	s.backlog = s.backlog[len(s.backlog):]
	for _, ci := range b {
		if err := s.stage(ci); err != nil {
			return err
		}
	}
	return nil
}

func (s *storeEngine) Reap(min int, out []Completion) (int, error) {
	if s.q == nil || s.closed {
		return 0, fmt.Errorf("%w: engine not open", ErrBadValue)
	}
	for len(s.ready) < min && s.pending > 0 {
		if err := s.flush(); err != nil {
			return 0, err
		}
		k, err := s.q.Reap(s.cqes, 1, waitTimeout)
		for _, c := range s.cqes[:k] {
			if err := s.step(c); err != nil {
				return 0, err
			}
		}
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrIO, err)
		}
	}
	if len(s.stale) >= staleBatch {
		s.removeStale()
	}
	n := copy(out, s.ready)
	s.ready = s.ready[:copy(s.ready, s.ready[n:])]
	return n, nil
}

// step moves a call on after its completion c.
func (s *storeEngine) step(c client.Completion) error {
	ci, st := int(c.UserData>>2), uint8(c.UserData&3)
	if ci >= len(s.calls) || s.calls[ci].step != st {
		return fmt.Errorf("%w: a completion for no call in flight (%d)", ErrIO, c.UserData)
	}
	cl := &s.calls[ci]
	// An Unpin refused all or nothing answers FAILED_PRECONDITION with its
	// records; any other call's error, or a short answer, fails its IOs.
	if err := cl.res.Check(c); err != nil && !(st == stepUnpin && errors.Is(err, client.ErrFailedPrecondition)) {
		for i := range cl.ios {
			cl.errs[i] = fmt.Errorf("%w: %w", ErrIO, err)
		}
		s.end(ci)
		return nil
	}
	keyErr := func(i int, what string) {
		if e := cl.res.Err(i); e != nil && cl.errs[i] == nil {
			cl.errs[i] = fmt.Errorf("%w: %s %s: %s", ErrIO, what, cl.keys[i], cl.res.Code(i))
		}
	}
	switch st {
	case stepReserve:
		for i, io := range cl.ios {
			keyErr(i, "reserve")
			if cl.errs[i] == nil {
				copy(cl.res.Value(i), s.slotMem[io.Slot][:io.Length])
			}
		}
		cl.step = stepCommit
		return s.stage(ci)
	case stepCommit:
		bs := s.job.BSMax
		for i, io := range cl.ios {
			keyErr(i, "commit")
			if cl.errs[i] != nil {
				continue
			}
			b := io.Offset / bs
			if old := s.gens[b]; cl.seqs[i] > old {
				if old != 0 {
					s.stale = append(s.stale, staleKey{io.Offset, old})
				}
				s.gens[b] = cl.seqs[i]
			}
		}
		s.end(ci)
	case stepGet:
		cl.ok = cl.ok[:0]
		for i, io := range cl.ios {
			keyErr(i, "get")
			if cl.errs[i] != nil {
				continue
			}
			cl.ok = append(cl.ok, cl.keys[i])
			v := cl.res.Value(i)
			if uint64(len(v)) < io.Length {
				cl.errs[i] = fmt.Errorf("%w: get %s: a %d-byte value for a %d-byte read", ErrIO, cl.keys[i], len(v), io.Length)
				continue
			}
			copy(s.slotMem[io.Slot][:io.Length], v)
		}
		if len(cl.ok) == 0 {
			s.end(ci)
			return nil
		}
		cl.step = stepUnpin
		return s.stage(ci)
	case stepUnpin:
		if c.Code != tcproto.CodeOK {
			for i := range cl.ios {
				if cl.errs[i] == nil {
					cl.errs[i] = fmt.Errorf("%w: unpin: %s", ErrIO, c.Code)
				}
			}
		}
		s.end(ci)
	}
	return nil
}

// end completes a call's IOs and frees it.
func (s *storeEngine) end(ci int) {
	cl := &s.calls[ci]
	for i, io := range cl.ios {
		r := Completion{Slot: io.Slot, N: io.Length, Err: cl.errs[i]}
		if r.Err != nil {
			r.N = 0
		}
		s.ready = append(s.ready, r)
	}
	s.pending -= len(cl.ios)
	s.free = append(s.free, ci)
}

// removeStale removes superseded keys on the socket; one that is pinned
// or busy now stays for the next round.
func (s *storeEngine) removeStale() {
	n := min(len(s.stale), staleBatch)
	s.rmKeys, s.rmBuf = s.rmKeys[:0], s.rmBuf[:0]
	for _, k := range s.stale[:n] {
		start := len(s.rmBuf)
		s.rmBuf = s.appendKey(s.rmBuf, k.off, k.seq)
		s.rmKeys = append(s.rmKeys, s.rmBuf[start:len(s.rmBuf):len(s.rmBuf)])
	}
	res := s.rmRes[:n]
	if err := s.c.StoreRemove(s.rmKeys, res); err != nil {
		return // the keys stay listed; the next round tries again
	}
	kept := s.stale[:0]
	for i, k := range s.stale[:n] {
		if res[i] != nil {
			kept = append(kept, k)
		}
	}
	s.stale = append(kept, s.stale[n:]...)
}

// Prefill stores every block of the region with the verify pattern of
// seed, through the queue as writes do (durably when the daemon has an
// L2, so that a region larger than L1 stays readable). It is not
// measured. Without needPattern there is nothing to lay out.
func (s *storeEngine) Prefill(seed uint64, needPattern bool) error {
	if !needPattern {
		return nil
	}
	bs := s.job.BSMax
	cl := &s.calls[0]
	blocks := s.spec.Region / bs
	for b0 := uint64(0); b0 < blocks; b0 += uint64(cl.res.Cap()) {
		cl.keys, cl.keyBuf = cl.keys[:0], cl.keyBuf[:0]
		for b := b0; b < min(blocks, b0+uint64(cl.res.Cap())); b++ {
			s.seq++
			start := len(cl.keyBuf)
			cl.keyBuf = s.appendKey(cl.keyBuf, b*bs, s.seq)
			cl.keys = append(cl.keys, cl.keyBuf[start:len(cl.keyBuf):len(cl.keyBuf)])
			cl.seqs[b-b0] = s.seq
		}
		if err := s.waitCall(func() (bool, error) { return s.q.Reserve(cl.keys, bs, cl.res, 1) }, cl.res, "reserve"); err != nil {
			return err
		}
		for i := range cl.keys {
			fillPattern(cl.res.Value(i), seed, (b0+uint64(i))*bs)
		}
		if err := s.waitCall(func() (bool, error) { return s.q.Commit(cl.keys, s.l2, cl.res, 2) }, cl.res, "commit"); err != nil {
			return err
		}
		for i := range cl.keys {
			s.gens[b0+uint64(i)] = cl.seqs[i]
		}
	}
	return nil
}

// waitCall submits one call outside the measured run and waits for it;
// every key must succeed.
func (s *storeEngine) waitCall(submit func() (bool, error), res *client.Results, what string) error {
	deadline := time.Now().Add(waitTimeout)
	for {
		ok, err := submit()
		if err != nil {
			return err
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: prefill %s: the queue has no room", ErrIO, what)
		}
		time.Sleep(time.Millisecond)
	}
	n, err := s.q.Reap(s.cqes[:1], 1, waitTimeout)
	if err != nil || n != 1 {
		return fmt.Errorf("%w: prefill %s: %v", ErrIO, what, err)
	}
	if err := res.Check(s.cqes[0]); err != nil {
		return fmt.Errorf("%w: prefill %s: %w", ErrIO, what, err)
	}
	for i := 0; i < res.Len(); i++ {
		if res.Code(i) != tcproto.CodeOK {
			return fmt.Errorf("%w: prefill %s of key %d of %d: %s", ErrIO, what, i, res.Len(), res.Code(i))
		}
	}
	return nil
}

// Peek returns block off's bytes as the store holds them now, read back
// on the socket.
func (s *storeEngine) Peek(off, n uint64) ([]byte, error) {
	bs := s.job.BSMax
	if off%bs != 0 || off >= s.spec.Region {
		return nil, fmt.Errorf("%w: peek not on a block", ErrBadValue)
	}
	v, err := s.c.GetBytes(s.appendKey(nil, off, s.gens[off/bs]))
	if err != nil {
		return nil, err
	}
	if uint64(len(v)) < n {
		return nil, fmt.Errorf("%w: a %d-byte value for %d bytes", ErrIO, len(v), n)
	}
	return v[:n], nil
}

// Close closes the queue and the connection, which releases the pins,
// reservations and buffers it holds in the daemon.
func (s *storeEngine) Close() error {
	if s.closed || s.c == nil {
		s.closed = true
		return nil
	}
	s.closed = true
	if s.q != nil {
		s.q.Close()
	}
	return s.c.Close()
}
