package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/xfer"
)

// Client kinds: what a client process of the soak does in a loop.
const (
	kindLocal  = "local"  // buffer <-> pool copies (local transport)
	kindURing  = "uring"  // pool <-> file on data_dir (io_uring, O_DIRECT)
	kindTCP    = "tcp"    // pool <-> the other daemon's export (tcp transport)
	kindQueue  = "queue"  // buffer <-> pool through a shared-memory queue
	kindENOSPC = "enospc" // pool -> files on a small tmpfs that the ENOSPC fault fills
	kindChurn  = "churn"  // connect, take resources, leave without freeing
	kindStore  = "store"  // the KV store: put, read back, reserve and abort, remove (storeSession)
	kindXStore = "xstore" // the store across hosts, on c and d: put, get the other side's keys, remove (xstore.go)
)

// opTimeout is every request's deadline; a call that has not returned
// hangGrace after it is a hang (unless its daemon was stopped meanwhile).
const (
	opTimeout = 5 * time.Second
	hangGrace = 5 * time.Second
)

// report is what a client process prints once a second (and at exit): its
// counts since it started, so the parent loses at most a second of them
// when the client is killed.
type report struct {
	Codes map[string]uint64 `json:"codes"` // "kind/CODE" -> requests
	Late  []lateOp          `json:"late,omitempty"`
	// Served is every xstore get that found a key after its removal had
	// been acknowledged (xstore.go), for the soak to judge against its
	// faults.
	Served []servedOp `json:"served_after_remove,omitempty"`
}

// lateOp is a call that returned (or is still out) past its deadline plus
// hangGrace.
type lateOp struct {
	What  string `json:"what"`
	Start int64  `json:"start_ms"`
	End   int64  `json:"end_ms"` // 0: still out when reported
}

// worker is one client process's state.
type worker struct {
	kind, socket, peer, dir string
	id                      int
	rng                     *rand.Rand

	// The store kind's, kept across its sessions (loop's goroutine only).
	log   putLog
	kept  []keptKey
	round int
	// The xstore kind's rounds whose every key a remove took, until they
	// are old enough to be asked for (see removals).
	removals removals

	// mu guards rep and cur.
	mu  sync.Mutex
	rep report
	cur *lateOp // the call in progress
}

// runClient is a client process: it runs kind against socket until
// killed, or until its stdin closes.
func runClient(kind, socket, peer, dir string, id int) int {
	w := &worker{kind: kind, socket: socket, peer: peer, dir: dir, id: id, rng: rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano()))),
		rep: report{Codes: map[string]uint64{}}}
	if kind == kindStore {
		l, err := openPutLog(dir, id)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tcsoak store client:", err)
			return 1
		}
		defer l.f.Close()
		w.log = l
	}
	stop := make(chan struct{})
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		close(stop)
	}()
	out := json.NewEncoder(os.Stdout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.loop(stop)
	}()
	for {
		select {
		case <-tick.C:
			w.flush(out)
		case <-done:
			w.flush(out)
			return 0
		}
	}
}

func (w *worker) flush(out *json.Encoder) {
	w.mu.Lock()
	if w.cur != nil && time.Since(time.UnixMilli(w.cur.Start)) > opTimeout+hangGrace {
		// Still out: report it now, in case nothing else will.
		w.rep.Late = append(w.rep.Late, *w.cur)
		w.cur.Start = -w.cur.Start // reported once while out
	}
	b, _ := json.Marshal(w.rep)
	w.rep.Late, w.rep.Served = nil, nil
	w.mu.Unlock()
	var r report
	_ = json.Unmarshal(b, &r)
	_ = out.Encode(r)
}

func (w *worker) count(code string, n uint64) {
	w.mu.Lock()
	w.rep.Codes[w.kind+"/"+code] += n
	w.mu.Unlock()
}

// timed runs one call and records it as late if it overran.
func (w *worker) timed(what string, f func() error) error {
	start := time.Now()
	w.mu.Lock()
	w.cur = &lateOp{What: what, Start: start.UnixMilli()}
	w.mu.Unlock()
	err := f()
	end := time.Now()
	w.mu.Lock()
	if end.Sub(start) > opTimeout+hangGrace {
		s := w.cur.Start
		if s < 0 {
			s = -s
		}
		w.rep.Late = append(w.rep.Late, lateOp{What: what, Start: s, End: end.UnixMilli()})
	}
	w.cur = nil
	w.mu.Unlock()
	return err
}

// codeOf names an error the way the report counts it.
func codeOf(err error) string {
	var se *client.StatusError
	switch {
	case err == nil:
		return "OK"
	case errors.As(err, &se):
		return se.Code.String()
	case errors.Is(err, client.ErrClosed):
		return "CONNECTION_LOST"
	}
	return "CLIENT_ERROR"
}

// results counts per-request results.
func (w *worker) results(res []error) {
	for _, e := range res {
		w.count(codeOf(e), 1)
	}
}

// loop connects, runs the kind's session until it fails, and reconnects,
// until stop.
func (w *worker) loop(stop <-chan struct{}) {
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-stop:
			return
		default:
		}
		c, err := client.Dial(w.socket, client.Options{Name: "tcsoak-" + w.kind, CallTimeout: opTimeout + hangGrace})
		if err != nil {
			w.count("DIAL_FAILED", 1)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		err = w.session(c, stop)
		c.Close()
		if err != nil && !errors.Is(err, errStop) {
			w.count("SESSION_"+codeOf(err), 1)
			time.Sleep(backoff)
		}
	}
}

var errStop = errors.New("stop")

// session runs the kind on one connection until an error ends it.
func (w *worker) session(c *client.Client, stop <-chan struct{}) error {
	pool, _ := c.Pool()
	const blk = 64 << 10
	offs, err := c.AllocBlocks(nil, 4, blk)
	if err != nil {
		return err
	}
	buf, err := c.RegisterBuffer(1 << 20)
	if err != nil {
		return err
	}
	var target xfer.SegmentID
	var targetSize uint64
	switch w.kind {
	case kindURing:
		id, size, err := c.RegisterFile(filepath.Join(w.dir, fmt.Sprintf("soak-%d.bin", w.id)), true, 16<<20)
		if err != nil {
			return err
		}
		target, targetSize = id, size
	case kindTCP:
		rs, err := c.OpenRemote(w.peer+"/soak-kv", client.RightRead|client.RightWrite)
		if err != nil {
			return err
		}
		target, targetSize = rs.ID, rs.Size
	case kindStore:
		return w.storeSession(c, buf, stop)
	case kindXStore:
		return w.xstoreSession(c, buf, stop)
	}
	var q *client.Queue
	if w.kind == kindQueue {
		if q, err = c.OpenQueue(64, client.WithRequestTimeout(opTimeout)); err != nil {
			return err
		}
		defer q.Close()
	}
	res := make([]error, 2)
	comps := make([]client.Completion, 64)
	reqs := make([]xfer.Request, 0, 64)
	uds := make([]uint64, 64)
	pattern := make([]byte, blk)
	for n := 0; ; n++ {
		select {
		case <-stop:
			return errStop
		default:
		}
		seed := byte(w.rng.Uint32())
		for i := range pattern {
			pattern[i] = seed + byte(i)
		}
		o := offs[n%len(offs)]
		copy(buf.Mem[:blk], pattern)
		switch w.kind {
		case kindLocal:
			err = w.timed("local transfer", func() error {
				_, err := c.Transfer([]xfer.Request{
					{Op: xfer.OpWrite, Local: buf.ID, Target: pool.Segment, TargetOffset: o, Length: blk},
					{Op: xfer.OpRead, Local: buf.ID, LocalOffset: blk, Target: pool.Segment, TargetOffset: o, Length: blk},
				}, opTimeout, res)
				return err
			})
			if err == nil {
				w.results(res)
				w.verify(res[1] == nil, buf.Mem[blk:2*blk], pattern)
			}
		case kindURing, kindTCP:
			at := uint64(w.rng.IntN(int(targetSize/blk))) * blk
			copy(c.PoolBytes()[o:o+blk], pattern)
			err = w.timed(w.kind+" write+read", func() error {
				_, err := c.Transfer([]xfer.Request{{Op: xfer.OpWrite, Local: pool.Segment, LocalOffset: o, Target: target, TargetOffset: at, Length: blk}}, opTimeout, res[:1])
				if err != nil || res[0] != nil {
					return err
				}
				_, err = c.Transfer([]xfer.Request{{Op: xfer.OpRead, Local: buf.ID, LocalOffset: blk, Target: target, TargetOffset: at, Length: blk}}, opTimeout, res[1:])
				return err
			})
			if err == nil && w.kind == kindTCP && res[0] != nil {
				switch codeOf(res[0]) {
				case "PERMISSION_DENIED", "NOT_FOUND":
					// The peer restarted: the segment was opened at its old
					// epoch. Open it again, as an engine would.
					w.results(res[:1])
					return res[0]
				}
			}
			if err == nil {
				w.results(res[:1])
				if res[0] == nil {
					w.results(res[1:])
					// Another tcp client may have written the same place of
					// the shared export in between: only files are checked.
					w.verify(w.kind == kindURing && res[1] == nil, buf.Mem[blk:2*blk], pattern)
				}
			}
		case kindQueue:
			reqs = reqs[:0]
			for i := range 32 {
				reqs = append(reqs, xfer.Request{Op: xfer.OpWrite, Local: buf.ID, LocalOffset: uint64(i%8) * 4096, Target: pool.Segment, TargetOffset: offs[i%4] + uint64(i%8)*4096, Length: 4096})
				uds[i] = uint64(i)
			}
			err = w.timed("queue batch", func() error {
				sent := 0
				for sent < len(reqs) {
					k, err := q.Submit(reqs[sent:], uds[sent:len(reqs)])
					if err != nil {
						return err
					}
					sent += k
				}
				for got := 0; got < sent; {
					k, err := q.Reap(comps, 1, opTimeout+time.Second)
					for _, cp := range comps[:k] {
						w.count(cp.Code.String(), 1)
					}
					got += k
					if err != nil {
						return err
					}
				}
				return nil
			})
		case kindENOSPC:
			err = w.enospcRound(c, pool.Segment, o, res[:1])
		case kindChurn:
			// Take more and leave without giving anything back: the daemon
			// releases it all when the connection goes.
			if _, err = c.AllocBlocks(nil, 8, blk); err == nil {
				_, err = c.AllocBatch(16)
			}
			w.count(codeOf(err), 1)
			return err
		}
		if err != nil {
			return err
		}
	}
}

// verify counts a read-back that did not return what was written.
func (w *worker) verify(check bool, got, want []byte) {
	if !check {
		return
	}
	for i := range want {
		if got[i] != want[i] {
			w.count("CORRUPT", 1)
			return
		}
	}
}

// enospcRound registers a fresh file on the small tmpfs, writes into it
// until it fails or has written 4 MiB, then unregisters and removes it.
func (w *worker) enospcRound(c *client.Client, pool xfer.SegmentID, off uint64, res []error) error {
	path := filepath.Join(w.dir, fmt.Sprintf("enospc-%d-%d.bin", w.id, w.rng.Uint32()))
	id, _, err := c.RegisterFile(path, false, 4<<20)
	if err != nil {
		w.count(codeOf(err), 1)
		return err
	}
	defer func() {
		_ = c.UnregisterBuffer(id)
		_ = os.Remove(path)
	}()
	for at := uint64(0); at < 4<<20; at += 64 << 10 {
		err := w.timed("enospc write", func() error {
			_, err := c.Transfer([]xfer.Request{{Op: xfer.OpWrite, Local: pool, LocalOffset: off, Target: id, TargetOffset: at, Length: 64 << 10}}, opTimeout, res)
			return err
		})
		if err != nil {
			return err
		}
		w.results(res)
		if res[0] != nil {
			return nil
		}
	}
	return nil
}

// storeSession is the store's traffic: rounds of copying Puts of 8 keys
// (16 KiB values from a registered buffer, under fresh keys; every other
// round durable), a Read of the same keys compared with what was put, a
// zero-copy Reserve that is given back with Abort, and a Remove of all but
// one key of the round. The key kept stays until storeKept later rounds
// have passed, so the store fills its L1 and evicts to L2, while L2 never
// fills (nothing durable is evicted from it). Keys are the client's own,
// so another client never overwrites them; a key the store evicted from
// L1 without L2 reads NOT_FOUND, which is counted, not a corruption.
//
// Every durable put the daemon acknowledged is written to the client's
// put log (see putLog) before anything else is done with the key, and
// every remove of such a key is logged before it is sent and after it is
// acknowledged: after a kill -9 of the daemon, the soak reads every
// acknowledged durable put back (putcheck.go) and checks that no
// acknowledged remove came back.
func (w *worker) storeSession(c *client.Client, buf *client.Buffer, stop <-chan struct{}) error {
	const nkeys, vlen = 8, 16 << 10
	keys := make([][]byte, nkeys)
	seeds := make([]byte, nkeys)
	vals := make([]client.Extent, nkeys)
	dests := make([]client.Extent, nkeys)
	lengths := make([]uint64, nkeys)
	res := make([]error, nkeys)
	sizes := []uint64{vlen, vlen}
	roffs := make([]uint64, 2)
	for i := range nkeys {
		vals[i] = client.Extent{Segment: buf.ID, Offset: uint64(i) * vlen, Length: vlen}
		dests[i] = client.Extent{Segment: buf.ID, Offset: (nkeys + uint64(i)) * vlen, Length: vlen}
	}
	if w.kept == nil {
		w.kept = make([]keptKey, 0, storeKept)
	}
	for n := 0; ; n++ {
		round, err := w.nextRound(stop)
		if err != nil {
			return err
		}
		durable := round%2 == 0
		for i := range nkeys {
			keys[i] = fmt.Appendf(keys[i][:0], "soak/%d/%d/%d", w.id, round, i)
			seeds[i] = byte(w.rng.Uint32())
			putPattern(buf.Mem[i*vlen:(i+1)*vlen], seeds[i])
		}
		put := make([]bool, nkeys)
		err = w.timed("store put+read", func() error {
			if err := c.StorePut(keys, vals, durable, res); err != nil {
				return err
			}
			w.storeResults("put", keys, res)
			for i, e := range res {
				put[i] = e == nil
				if put[i] && durable {
					w.log.put(keys[i], seeds[i])
				}
			}
			clear(buf.Mem[nkeys*vlen : 2*nkeys*vlen])
			return c.StoreRead(keys, dests, lengths, res)
		})
		if err != nil {
			return err
		}
		for i, e := range res {
			if !put[i] {
				continue
			}
			w.storeResults("read", keys[i:i+1], res[i:i+1])
			if e == nil {
				w.verify(lengths[i] == vlen, buf.Mem[(nkeys+i)*vlen:(nkeys+i+1)*vlen], buf.Mem[i*vlen:(i+1)*vlen])
				if lengths[i] != vlen {
					w.count("CORRUPT", 1)
				}
			}
		}
		if n%4 == 3 {
			rk := [][]byte{fmt.Appendf(nil, "soak/%d/r%d", w.id, round), fmt.Appendf(nil, "soak/%d/r%d+", w.id, round)}
			err = w.timed("store reserve+abort", func() error {
				if err := c.StoreReserve(rk, sizes, roffs, res[:2]); err != nil {
					return err
				}
				w.storeResults("reserve", rk, res[:2])
				reserved := res[0] == nil || res[1] == nil
				if !reserved {
					return nil
				}
				if err := c.StoreAbort(rk, res[:2]); err != nil {
					return err
				}
				w.storeResults("abort", rk, res[:2])
				return nil
			})
			if err != nil {
				return err
			}
		}
		// Most keys are removed again; the first stays for storeKept
		// rounds, so the store fills up and evicts.
		rm := keys[1:]
		if put[0] {
			w.kept = append(w.kept, keptKey{key: slices.Clone(keys[0]), durable: durable})
		}
		oldDurable := false
		if len(w.kept) > storeKept {
			old := w.kept[0]
			w.kept = w.kept[1:]
			rm = append(rm[:len(rm):len(rm)], old.key)
			oldDurable = old.durable
		}
		// The durable keys among rm, for the log: the round's own when it
		// was durable, and the kept key leaving when it was put durably.
		logged := rm[:0:0]
		if durable {
			logged = rm[:nkeys-1]
		}
		if oldDurable {
			logged = append(logged[:len(logged):len(logged)], rm[len(rm)-1])
		}
		w.log.removing(logged)
		if err := w.timed("store remove", func() error { return c.StoreRemove(rm, res[:len(rm)]) }); err != nil {
			return err
		}
		w.storeResults("remove", rm, res[:len(rm)])
		if !durable {
			w.log.removed(logged, res[len(rm)-len(logged):len(rm)])
		} else {
			w.log.removed(logged, res[:len(logged)])
		}
	}
}

// nextRound returns the next round of a store kind's session, or errStop
// once stop is closed.
func (w *worker) nextRound(stop <-chan struct{}) (int, error) {
	select {
	case <-stop:
		return 0, errStop
	default:
	}
	r := w.round
	w.round++
	return r, nil
}

// storeResults counts a store call's results, and a BUSY also under the
// call that got it ("BUSY-in-put"): the store's clients are single
// writers, so a BUSY is the store's own doing, but for a key the soak's
// read-back after a kill -9 (putcheck.go) was reading at that moment. The
// put log says which key and when (putLog.busy), for the soak to tell the
// two apart and to name the others.
func (w *worker) storeResults(call string, keys [][]byte, res []error) {
	for i, e := range res {
		c := codeOf(e)
		w.count(c, 1)
		if c == "BUSY" {
			w.count("BUSY-in-"+call, 1)
			w.log.busy(call, keys[i], time.Now())
		}
	}
}

// storeKept is how many kept keys a store client holds at most (one per
// round): with two clients a daemon that is twice its L1 capacity, a
// small part of L2.
const storeKept = 2048

// keptKey is a key a store client keeps for a while.
type keptKey struct {
	key     []byte
	durable bool
}

// putPattern is a durable put's value: seed + the byte's index.
func putPattern(v []byte, seed byte) {
	for k := range v {
		v[k] = seed + byte(k)
	}
}

// putLog is a store client's record of its acknowledged durable puts, for
// the soak to check after a kill -9: one line per event, appended with one
// write each ("P key seed" once a durable put was acknowledged, "X key"
// before a remove of it is sent, "R key" once that remove was
// acknowledged). A key with X but no R may be there or not; with P and no
// X it must be read back byte-exact; with R it must stay gone. "B key ms
// call" records a BUSY answer for any of the client's keys, received at
// that Unix time in milliseconds.
type putLog struct{ f *os.File }

func openPutLog(dir string, id int) (putLog, error) {
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("puts-%d.log", id)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	return putLog{f}, err
}

func (l putLog) put(key []byte, seed byte) {
	_, _ = l.f.Write(fmt.Appendf(nil, "P %s %d\n", key, seed))
}

// busy logs B for a call's BUSY answer for key, received at t.
func (l putLog) busy(call string, key []byte, t time.Time) {
	_, _ = l.f.Write(fmt.Appendf(nil, "B %s %d %s\n", key, t.UnixMilli(), call))
}

// removing logs X for keys, durable keys about to be removed.
func (l putLog) removing(keys [][]byte) {
	if len(keys) == 0 {
		return
	}
	var b []byte
	for _, k := range keys {
		b = fmt.Appendf(b, "X %s\n", k)
	}
	_, _ = l.f.Write(b)
}

// removed logs R for the keys whose remove res says was acknowledged.
func (l putLog) removed(keys [][]byte, res []error) {
	var b []byte
	for i, k := range keys {
		if res[i] == nil {
			b = fmt.Appendf(b, "R %s\n", k)
		}
	}
	if len(b) > 0 {
		_, _ = l.f.Write(b)
	}
}

// proc is one client process under the supervisor.
type proc struct {
	kind  string
	d     *daemon
	id    int
	cmd   *exec.Cmd
	stdin io.WriteCloser // closing it asks the client to stop
	done  chan struct{}
	last  report // the latest report of this incarnation
	mu    sync.Mutex
}

// startClient runs a client process of kind against d.
func startClient(self, kind string, d *daemon, peer string, dir string, id int) (*proc, error) {
	cmd := exec.Command(self, "-client", kind, "-socket", d.socket, "-peer", peer, "-dir", dir, "-id", strconv.Itoa(id))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{kind: kind, d: d, id: id, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		dec := json.NewDecoder(stdout)
		for {
			var r report
			if err := dec.Decode(&r); err != nil {
				break
			}
			p.mu.Lock()
			late := append(p.last.Late, r.Late...)
			served := append(p.last.Served, r.Served...)
			p.last = r
			p.last.Late, p.last.Served = late, served
			p.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	return p, nil
}

// finish asks the client to stop, and SIGKILLs it if it has not within
// limit.
func (p *proc) finish(limit time.Duration) {
	_ = p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(limit):
		p.kill()
	}
}

// kill SIGKILLs the client and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) report() report {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}
