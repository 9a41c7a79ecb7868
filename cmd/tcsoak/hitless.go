package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/client"
)

// hitless is the hitless-restart fault: daemon d runs with systemd's file
// descriptor store played by the soak (fdstore.Store); a client of its own puts
// hitlessKeys values in d's store, d is restarted (SIGTERM and SIGKILL in
// turn), and every value committed before is read back byte-exact from the
// next daemon through the same client, which reconnects by itself and
// keeps its pool mapping (client.Options.Reconnect).
type hitless struct {
	d *daemon

	// mu guards the fields below.
	mu        sync.Mutex
	restarts  int
	committed uint64 // values committed before a restart, summed
	readBack  uint64
	lost      uint64
	lostAt    []string
}

const (
	hitlessKeys  = 1024
	hitlessValue = 4096
	hitlessBatch = 64
)

func hitlessPattern(v []byte, round, i int) {
	for k := range v {
		v[k] = byte(round*131+i*7) ^ byte(k)
	}
}

// run does one restart, with SIGKILL when kill is set.
func (h *hitless) run(kill bool) (string, error) {
	if h.d.fds == nil {
		return "skipped: no fd store", nil
	}
	names := strings.Join(h.d.fds.Names(), ",")
	if !strings.Contains(names, "pool-") || !strings.Contains(names, "l1journal-") {
		return "", fmt.Errorf("%s handed its fd store %q: no pool and L1 journal to keep", h.d.name, names)
	}
	h.mu.Lock()
	round := h.restarts
	h.mu.Unlock()
	c, err := client.Dial(h.d.socket, client.Options{Name: "tcsoak-hitless", Reconnect: true, CallTimeout: 30 * time.Second})
	if err != nil {
		return "", err
	}
	defer c.Close()
	mem := c.PoolBytes()
	buf, err := c.RegisterBuffer(hitlessBatch * hitlessValue)
	if err != nil {
		return "", err
	}
	keys := make([][]byte, 0, hitlessKeys)
	var committed [][]byte
	vals := make([]client.Extent, hitlessBatch)
	res := make([]error, hitlessBatch)
	for i := range vals {
		vals[i] = client.Extent{Segment: buf.ID, Offset: uint64(i) * hitlessValue, Length: hitlessValue}
	}
	for lo := 0; lo < hitlessKeys; lo += hitlessBatch {
		batch := keys[len(keys):]
		for i := range hitlessBatch {
			batch = append(batch, fmt.Appendf(nil, "hitless/%d/%d", round, lo+i))
			hitlessPattern(buf.Mem[i*hitlessValue:(i+1)*hitlessValue], round, lo+i)
		}
		keys = keys[:len(keys)+hitlessBatch]
		if err := c.StorePut(batch, vals, false, res); err != nil {
			return "", err
		}
		for i, e := range res {
			if e == nil {
				committed = append(committed, batch[i])
			}
		}
	}

	sig := "SIGTERM"
	start := time.Now()
	if kill {
		sig = "SIGKILL"
		h.d.kill()
	} else if _, err := h.d.stop(3*time.Second + 5*time.Second); err != nil {
		return "", err
	}
	if err := h.d.start(); err != nil {
		return "", err
	}
	took := time.Since(start)

	// The call that finds the connection broken fails; the next redials.
	if err := c.Ping(nil); err != nil {
		if err := c.Ping(nil); err != nil {
			return "", fmt.Errorf("the client did not reconnect: %w", err)
		}
	}
	if &c.PoolBytes()[0] != &mem[0] {
		return "", errors.New("the client mapped the pool again")
	}
	buf, err = c.RegisterBuffer(hitlessBatch * hitlessValue) // the old one went with the connection
	if err != nil {
		return "", err
	}
	dests := vals
	for i := range dests {
		dests[i].Segment = buf.ID
	}
	lengths := make([]uint64, hitlessBatch)
	want := make([]byte, hitlessValue)
	var lost []string
	var r, idx int
	for lo := 0; lo < len(committed); lo += hitlessBatch {
		batch := committed[lo:min(lo+hitlessBatch, len(committed))]
		if err := c.StoreRead(batch, dests[:len(batch)], lengths[:len(batch)], res[:len(batch)]); err != nil {
			return "", err
		}
		for i, k := range batch {
			fmt.Sscanf(string(k), "hitless/%d/%d", &r, &idx)
			hitlessPattern(want, r, idx)
			got := buf.Mem[i*hitlessValue : (i+1)*hitlessValue]
			if res[i] != nil || lengths[i] != hitlessValue || !bytes.Equal(got, want) {
				lost = append(lost, fmt.Sprintf("%s after %s: %s (%d bytes)", k, sig, codeOf(res[i]), lengths[i]))
			}
		}
	}
	// Give the values back: the store clients fill L1 enough.
	for lo := 0; lo < len(committed); lo += hitlessBatch {
		batch := committed[lo:min(lo+hitlessBatch, len(committed))]
		_ = c.StoreRemove(batch, res[:len(batch)])
	}
	kept := lastLogLine(h.d, "L1 values kept across the restart", "tenant="+soakTenant)

	h.mu.Lock()
	h.restarts++
	h.committed += uint64(len(committed))
	h.readBack += uint64(len(committed) - len(lost))
	h.lost += uint64(len(lost))
	for _, l := range lost {
		if len(h.lostAt) < 20 {
			h.lostAt = append(h.lostAt, l)
		}
	}
	h.mu.Unlock()
	return fmt.Sprintf("%s restarted with %s in %v keeping its pool; %d of %d committed values read back byte-exact by a client that reconnected (%s)",
		h.d.name, sig, took.Round(time.Millisecond), len(committed)-len(lost), len(committed), kept), nil
}

// lastLogLine is the last line of d's log that contains s and also, when
// given, and.
func lastLogLine(d *daemon, s, and string) string {
	b, err := os.ReadFile(d.logf.Name())
	if err != nil {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) && strings.Contains(lines[i], and) {
			return strings.TrimSpace(lines[i])
		}
	}
	return "no \"" + s + "\" in its log"
}
