package store

import (
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/xfer"
)

// call is the record of one asynchronous call while some of its keys wait
// for L2: where their results go, and how many are still owed. Records are
// reused.
type call struct {
	codes []Code
	errs  []error
	locs  []Location
	dsts  [][]byte
	lens  []uint64
	done  Completion
	tag   uint64
	// left counts the keys still owed a result, plus one for the calling
	// goroutine until it has dispatched everything; whoever brings it to
	// zero ends the call.
	left atomic.Int32
	// its and xts are the calling goroutine's scratch: the tasks it
	// dispatches.
	its []*ioTask
	sub []*ioTask
	xts []*xfer.Task
	w   *waiter // set when the caller blocks (done == nil)
	// same are keys named again in the call whose result is an earlier
	// position's, copied once every result is final (settle).
	same []samePos
	// gone are the records a Remove call's keys are being removed by it,
	// with their positions (removes), so that a key named again joins.
	gone []removal
	next *call
}

// removal is a record a Remove call is removing, at key pos.
type removal struct {
	r   ref
	pos int32
}

// samePos says that key dup of a call answers what key of answers.
type samePos struct{ dup, of int32 }

// callPool is a free list of call records.
type callPool struct {
	mu   sync.Mutex // guards free
	free *call
	// live counts the records taken and not yet put back: the calls in
	// flight, which bound the keys waiting for an L2 task (wait.go).
	live atomic.Int64
}

func (p *callPool) get(done Completion, tag uint64) *call {
	p.mu.Lock()
	c := p.free
	if c != nil {
		p.free = c.next
		c.next = nil
	}
	p.mu.Unlock()
	if c == nil {
		c = &call{}
	}
	c.done, c.tag = done, tag
	if done == nil {
		c.w = waiterPool.Get().(*waiter)
		c.done = c.w
	}
	c.left.Store(1)
	p.live.Add(1)
	return c
}

func (p *callPool) put(c *call) {
	c.codes, c.errs, c.locs, c.dsts, c.lens, c.done, c.w = nil, nil, nil, nil, nil, nil, nil
	clear(c.its)
	c.its = c.its[:0]
	clear(c.xts)
	c.xts = c.xts[:0]
	clear(c.sub)
	c.sub = c.sub[:0]
	c.same = c.same[:0]
	c.gone = c.gone[:0]
	p.live.Add(-1)
	p.mu.Lock()
	c.next = p.free
	p.free = c
	p.mu.Unlock()
}

// add makes key i's result wait for it, an L2 task the caller dispatches.
func (c *call) add(it *ioTask, i int) {
	it.cl, it.pos = c, int32(i)
	c.left.Add(1)
	c.its = append(c.its, it)
}

// result records key pos's outcome.
func (c *call) result(pos int32, err error) {
	c.codes[pos] = status.CodeOf(err)
	if c.errs != nil {
		c.errs[pos] = err
	}
}

// removes records that key pos's result is owed by the removal of record
// r this call started (or joined).
func (c *call) removes(pos int, r ref) { c.gone = append(c.gone, removal{r, int32(pos)}) }

// removing is the position of the key whose removal of record r this call
// owes, -1 when none.
func (c *call) removing(r ref) int {
	for _, g := range c.gone {
		if g.r == r {
			return int(g.pos)
		}
	}
	return -1
}

// answerAs makes key dup answer what key of (an earlier position of the
// same key, whose result is owed) comes to.
func (c *call) answerAs(dup, of int) {
	c.same = append(c.same, samePos{int32(dup), int32(of)})
}

// settle copies the results of the keys named again; whoever brings left
// to zero calls it, before the caller may read the results.
func (c *call) settle() {
	for _, p := range c.same {
		c.codes[p.dup] = c.codes[p.of]
		if c.errs != nil {
			c.errs[p.dup] = c.errs[p.of]
		}
	}
}

// finish1 ends one owed key; the last one ends the call.
func (c *call) finish1(p *callPool) {
	if c.left.Add(-1) == 0 {
		c.settle()
		d, tag := c.done, c.tag
		if c.w == nil {
			p.put(c)
		}
		// A blocking caller's record is recycled by the caller once it
		// has woken up.
		d.StoreDone(tag)
	}
}

// release is the calling goroutine's end of the call: it reports whether
// keys are still owed (StoreDone follows). A blocking caller waits here
// instead, and then pending is false.
func (c *call) release(p *callPool) (pending bool) {
	if c.w != nil {
		w := c.w
		if c.left.Add(-1) != 0 {
			<-w.ch
		} else {
			c.settle()
		}
		waiterPool.Put(w)
		p.put(c)
		return false
	}
	if c.left.Add(-1) == 0 {
		c.settle()
		p.put(c)
		return false
	}
	return true
}

// waiter is the Completion of a blocking call.
type waiter struct{ ch chan struct{} }

func (w *waiter) StoreDone(uint64) { w.ch <- struct{}{} }

var waiterPool = sync.Pool{New: func() any { return &waiter{ch: make(chan struct{}, 1)} }}
