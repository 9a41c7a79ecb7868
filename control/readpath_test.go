package control

import (
	"bytes"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

const modulePrefix = "github.com/tensorcast/tensorcast/"

// pathSpy is the memory transport with a look at who called it: the
// packages of this module on the stack of each Submit, outermost first,
// each run of one package's frames as one entry.
type pathSpy struct {
	xfer.Transport
	mu    sync.Mutex // guards paths
	paths [][]string
}

func (s *pathSpy) Submit(ts []*xfer.Task) (int, error) {
	pcs := make([]uintptr, 128)
	n := runtime.Callers(2, pcs) // from the caller of this method down
	frames := runtime.CallersFrames(pcs[:n])
	var path []string
	for {
		f, more := frames.Next()
		if pkg := funcPackage(f.Function); strings.HasPrefix(pkg, modulePrefix) {
			pkg = strings.TrimPrefix(pkg, modulePrefix)
			if len(path) == 0 || path[len(path)-1] != pkg {
				path = append(path, pkg)
			}
		}
		if !more {
			break
		}
	}
	slices.Reverse(path)
	s.mu.Lock()
	s.paths = append(s.paths, path)
	s.mu.Unlock()
	return s.Transport.Submit(ts)
}

// funcPackage is the import path of a function named as runtime.Frame
// names it ("path/pkg.(*T).M", "path/pkg.F.func1").
func funcPackage(fn string) string {
	slash := strings.LastIndexByte(fn, '/')
	if dot := strings.IndexByte(fn[slash+1:], '.'); dot >= 0 {
		return fn[:slash+1+dot]
	}
	return fn
}

// TestQueueReadPath: a queue READ of pool blocks into the client's buffer
// reaches its transport from the reactor's worker through session and
// xfer only, each entered once: no call back into a package it left, and
// nothing of control's or daemon's on the way (session/doc.go, "A queue
// READ, end to end"). The way back is xfer's to the queue's ring
// (Stream → StreamSink, queue.DaemonRing.StreamDone), which this cannot
// see; the bytes read back are checked.
func TestQueueReadPath(t *testing.T) {
	spy := &pathSpy{Transport: xfer.NewLocal(xfer.LocalConfig{Workers: 1}, nil)}
	e := newEnv(t, false, func(_ *Config, d *Deps) {
		eng := xfer.NewEngine(xfer.Config{}, xfer.KindRouter{Mem: spy}, nil)
		t.Cleanup(func() { eng.Close(); spy.Close() })
		d.Engine = eng
	})
	c, q := queueClient(t, e, 16)
	buf, err := c.RegisterBuffer(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	offs, err := c.AllocBlocks(nil, 1, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	pool := c.PoolBytes()[offs[0] : offs[0]+64<<10]
	for i := range pool {
		pool[i] = byte(i * 7)
	}
	req := xfer.Request{Op: xfer.OpRead, Local: buf.ID, Target: testPoolID, TargetOffset: offs[0], Length: 64 << 10}
	if n, err := q.Submit([]xfer.Request{req}, []uint64{1}); n != 1 || err != nil {
		t.Fatalf("submit: %d %v", n, err)
	}
	if cq := reapAll(t, q, 1)[1]; cq.Err() != nil || cq.N != 64<<10 {
		t.Fatalf("read: %+v", cq)
	}
	if !bytes.Equal(buf.Mem, pool) {
		t.Fatal("the buffer does not hold the pool's bytes after the read")
	}
	spy.mu.Lock()
	defer spy.mu.Unlock()
	if len(spy.paths) != 1 {
		t.Fatalf("%d submits reached the transport for one READ: %q", len(spy.paths), spy.paths)
	}
	if want := []string{"reactor", "session", "xfer"}; !slices.Equal(spy.paths[0], want) {
		t.Fatalf("a queue READ reached its transport through %q, want %q", spy.paths[0], want)
	}
	t.Logf("packages from the worker's thread to the transport: %q", spy.paths[0])
}
