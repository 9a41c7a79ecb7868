package main

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/xfer"
)

// durable writes numbered 4 KiB slots of a file on daemon b through the
// io_uring tier, one request at a time, and remembers every write b
// acknowledged. After b is SIGKILLed, check reads the file itself and
// counts acknowledged writes whose bytes are not there. (Acknowledged
// durable puts of the store are checked by putCheck.)
type durable struct {
	d    *daemon
	path string

	// mu guards the fields below.
	mu    sync.Mutex
	acked map[int64]uint32 // slot -> seed of its last acknowledged write
	// uncertain are slots with a write out, or one that failed after it
	// may have reached the file: their content is either version.
	uncertain map[int64]bool
	writes    uint64
	checks    int
	checked   uint64
	lost      uint64
	lostAt    []string
}

const (
	durSlot  = 4096
	durSlots = 4096
)

func newDurable(d *daemon) *durable {
	return &durable{d: d, path: d.dir + "/data/durable.bin", acked: map[int64]uint32{}, uncertain: map[int64]bool{}}
}

func durPattern(dst []byte, seed uint32) {
	for i := range dst {
		dst[i] = byte(seed>>(8*(i%4))) ^ byte(i)
	}
}

// run writes until stop, reconnecting while b is down.
func (du *durable) run(stop <-chan struct{}) {
	for n := uint32(1); ; {
		select {
		case <-stop:
			return
		default:
		}
		c, err := client.Dial(du.d.socket, client.Options{Name: "tcsoak-durable", CallTimeout: opTimeout + hangGrace})
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		n = du.session(c, n, stop)
		c.Close()
	}
}

func (du *durable) session(c *client.Client, n uint32, stop <-chan struct{}) uint32 {
	pool, _ := c.Pool()
	offs, err := c.AllocBlocks(nil, 1, durSlot)
	if err != nil {
		return n
	}
	id, _, err := c.RegisterFile(du.path, true, durSlot*durSlots)
	if err != nil {
		return n
	}
	res := make([]error, 1)
	for ; ; n++ {
		select {
		case <-stop:
			return n
		default:
		}
		slot := int64(n % durSlots)
		durPattern(c.PoolBytes()[offs[0]:offs[0]+durSlot], n)
		du.mu.Lock()
		du.uncertain[slot] = true
		du.mu.Unlock()
		_, err := c.Transfer([]xfer.Request{{Op: xfer.OpWrite, Local: pool.Segment, LocalOffset: offs[0], Target: id,
			TargetOffset: uint64(slot) * durSlot, Length: durSlot}}, opTimeout, res)
		du.mu.Lock()
		if err == nil && res[0] == nil {
			du.acked[slot] = n
			du.writes++
			delete(du.uncertain, slot)
		}
		// A write that failed leaves its slot uncertain until a later one
		// is acknowledged.
		du.mu.Unlock()
		if err != nil {
			return n + 1
		}
	}
}

// check reads every acknowledged slot from the file (b is dead: nothing
// writes it) and counts those that do not hold their last acknowledged
// bytes; a slot whose write was out when b died is skipped.
func (du *durable) check() error {
	du.mu.Lock()
	defer du.mu.Unlock()
	f, err := os.Open(du.path)
	if err != nil {
		if len(du.acked) == 0 {
			return nil
		}
		return err
	}
	defer f.Close()
	got, want := make([]byte, durSlot), make([]byte, durSlot)
	du.checks++
	for slot, seed := range du.acked {
		if du.uncertain[slot] {
			continue
		}
		du.checked++
		if _, err := f.ReadAt(got, slot*durSlot); err != nil {
			du.lost++
			du.lostAt = append(du.lostAt, fmt.Sprintf("slot %d: %v", slot, err))
			continue
		}
		durPattern(want, seed)
		if string(got) != string(want) {
			du.lost++
			du.lostAt = append(du.lostAt, fmt.Sprintf("slot %d (write %d)", slot, seed))
		}
	}
	return nil
}
