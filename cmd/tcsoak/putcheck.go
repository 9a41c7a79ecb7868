package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/client"
)

// putCheck reads back, after a kill -9 of a daemon, every durable put its
// store clients logged as acknowledged (putLog), and checks that no key
// whose remove was acknowledged came back.
type putCheck struct {
	d   *daemon
	dir string // the daemon's store clients' put logs

	// mu guards the fields below.
	mu          sync.Mutex
	checks      int
	acked       uint64 // acknowledged durable puts logged, over all checks' latest
	checked     uint64 // read back, summed over checks
	lost        uint64
	resurrected uint64 // removed (acknowledged) and served again after the restart
	removedSeen uint64 // removed keys checked, summed over checks
	lostAt      []string
	// reads are the read-back's calls, each with its keys and when it
	// was in flight: a store client's remove of such a key may be
	// answered BUSY then (busyDuringReads).
	reads []readSpan
}

// readSpan is one read-back call: its keys, and from before it was sent
// to after its answer came.
type readSpan struct {
	keys       map[string]bool
	start, end time.Time
}

// putState is what the logs say of a key.
type putState struct {
	seed     byte
	put      bool // P: acknowledged durable put
	removing bool // X: a remove was sent
	removed  bool // R: the remove was acknowledged
}

// maxRemovedChecked bounds the removed keys read per check (the newest of
// each log are taken).
const maxRemovedChecked = 8192

// snapshot reads every put log as it is now (the daemon is dead: nothing
// it acknowledged is missing, but for a line a client had not written yet).
func (pc *putCheck) snapshot() (map[string]putState, [][]byte, error) {
	files, err := filepath.Glob(filepath.Join(pc.dir, "puts-*.log"))
	if err != nil {
		return nil, nil, err
	}
	keys := map[string]putState{}
	var removed [][]byte
	for _, f := range files {
		var fileRemoved [][]byte
		err := readPutLog(f, func(op byte, key []byte, seed byte, _ time.Time) {
			if op == 'B' {
				return // a BUSY answer (busyAnswers)
			}
			st := keys[string(key)]
			switch op {
			case 'P':
				st.put, st.seed = true, seed
			case 'X':
				st.removing = true
			case 'R':
				st.removed = true
				fileRemoved = append(fileRemoved, key)
			}
			keys[string(key)] = st
		})
		if err != nil {
			return nil, nil, err
		}
		per := maxRemovedChecked / max(len(files), 1)
		if len(fileRemoved) > per {
			fileRemoved = fileRemoved[len(fileRemoved)-per:]
		}
		removed = append(removed, fileRemoved...)
	}
	return keys, removed, nil
}

// logFields is how many fields a put log line of an op with more than two
// has (putLog).
var logFields = map[byte]int{'P': 3, 'B': 4}

// readPutLog calls f for each whole line of the log at path: its op and
// key, a P line's seed, a B line's time.
func readPutLog(path string, f func(op byte, key []byte, seed byte, at time.Time)) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		return nil
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 4096), 4096)
	for sc.Scan() {
		fs := bytes.Fields(sc.Bytes())
		if len(fs) < 2 || len(fs[0]) != 1 {
			return fmt.Errorf("%s: a malformed line %q", path, sc.Bytes())
		}
		op := fs[0][0]
		if n := logFields[op]; n != 0 && len(fs) != n {
			return fmt.Errorf("%s: a malformed line %q", path, sc.Bytes())
		}
		var seed byte
		var at time.Time
		var err error
		switch op {
		case 'P':
			var n uint64
			n, err = strconv.ParseUint(string(fs[2]), 10, 8)
			seed = byte(n)
		case 'B':
			var ms int64
			ms, err = strconv.ParseInt(string(fs[2]), 10, 64)
			at = time.UnixMilli(ms)
		}
		if err != nil {
			return fmt.Errorf("%s: %q: %w", path, sc.Bytes(), err)
		}
		f(op, bytes.Clone(fs[1]), seed, at)
	}
	return sc.Err()
}

// verify reads back, from the restarted daemon, what snap says must be
// there (byte-exact) and what must stay gone. A key that reads NOT_FOUND
// is excused only when its client has since logged a remove of it (it
// goes on putting and removing against the restarted daemon).
func (pc *putCheck) verify(snap map[string]putState, removed [][]byte) error {
	const vlen, batch = 16 << 10, 64
	c, err := client.Dial(pc.d.socket, client.Options{Name: "tcsoak-putcheck", NoPool: true, CallTimeout: 30 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	buf, err := c.RegisterBuffer(batch * vlen)
	if err != nil {
		return err
	}
	var want [][]byte
	seeds := map[string]byte{}
	for k, st := range snap {
		if st.put && !st.removing {
			want = append(want, []byte(k))
			seeds[k] = st.seed
		}
	}
	var lost []string
	var checked, resurrected uint64
	dests := make([]client.Extent, batch)
	for i := range dests {
		dests[i] = client.Extent{Segment: buf.ID, Offset: uint64(i) * vlen, Length: vlen}
	}
	lengths := make([]uint64, batch)
	res := make([]error, batch)
	exp := make([]byte, vlen)
	read := func(keys [][]byte) error {
		n := len(keys)
		span := readSpan{keys: make(map[string]bool, n), start: time.Now()}
		for _, k := range keys {
			span.keys[string(k)] = true
		}
		err := c.StoreRead(keys, dests[:n], lengths[:n], res[:n])
		span.end = time.Now()
		pc.mu.Lock()
		pc.reads = append(pc.reads, span)
		pc.mu.Unlock()
		return err
	}
	for lo := 0; lo < len(want); lo += batch {
		keys := want[lo:min(lo+batch, len(want))]
		if err := read(keys); err != nil {
			return err
		}
		for i, k := range keys {
			checked++
			putPattern(exp, seeds[string(k)])
			got := buf.Mem[uint64(i)*vlen : uint64(i+1)*vlen]
			if res[i] == nil && lengths[i] == vlen && bytes.Equal(got, exp) {
				continue
			}
			why := codeOf(res[i])
			if res[i] == nil {
				why = fmt.Sprintf("other bytes (%d long)", lengths[i])
			}
			lost = append(lost, string(k)+": "+why)
		}
	}
	for lo := 0; lo < len(removed); lo += batch {
		keys := removed[lo:min(lo+batch, len(removed))]
		if err := read(keys); err != nil {
			return err
		}
		for i, k := range keys {
			if res[i] == nil {
				resurrected++
				lost = append(lost, string(k)+": removed (acknowledged) before the kill, served after it")
			}
		}
	}
	// A key reported missing may have been removed by its client since:
	// the logs say so now.
	if len(lost) > 0 {
		now, _, err := pc.snapshot()
		if err != nil {
			return err
		}
		kept := lost[:0]
		for _, l := range lost {
			k, _, _ := strings.Cut(l, ": ")
			if st := now[k]; st.removing && !snap[k].removing && snap[k].put {
				continue
			}
			kept = append(kept, l)
		}
		lost = kept
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.checks++
	pc.acked = uint64(len(want))
	pc.checked += checked
	pc.removedSeen += uint64(len(removed))
	pc.resurrected += resurrected
	pc.lost += uint64(len(lost)) - resurrected
	for _, l := range lost {
		if len(pc.lostAt) < 20 {
			pc.lostAt = append(pc.lostAt, l)
		}
	}
	return nil
}

// busyAnswer is a BUSY a store client logged (putLog.busy).
type busyAnswer struct {
	key string
	at  time.Time
}

// busyAnswers reads the BUSY answers logged in the put logs of dir.
func busyAnswers(dir string) ([]busyAnswer, error) {
	files, err := filepath.Glob(filepath.Join(dir, "puts-*.log"))
	if err != nil {
		return nil, err
	}
	var bs []busyAnswer
	for _, f := range files {
		err := readPutLog(f, func(op byte, key []byte, _ byte, at time.Time) {
			if op == 'B' {
				bs = append(bs, busyAnswer{string(key), at})
			}
		})
		if err != nil {
			return nil, err
		}
	}
	return bs, nil
}

// busySlack is how long after a read-back call's answer a BUSY it caused
// may still be logged: the client's remove was answered while the read
// was in flight, and its log line follows the answer.
const busySlack = time.Second

// busyDuringReads splits bs, the BUSY answers of one daemon's store
// clients, into those whose key a read-back call of that daemon (reads)
// was reading when the answer came (a second caller on the key: BUSY is
// the store's right answer) and the others, which the store gave a single
// writer of its own accord.
func busyDuringReads(bs []busyAnswer, reads []readSpan) (during int, other []busyAnswer) {
	for _, b := range bs {
		// Logged to the millisecond: a span is taken from the start of
		// its millisecond.
		found := slices.ContainsFunc(reads, func(r readSpan) bool {
			return r.keys[b.key] && !b.at.Before(r.start.Truncate(time.Millisecond)) && !b.at.After(r.end.Add(busySlack))
		})
		if found {
			during++
		} else {
			other = append(other, b)
		}
	}
	return during, other
}
