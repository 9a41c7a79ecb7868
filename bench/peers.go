package bench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/xfer"
)

func init() {
	engines["tcp"] = newPeerEngine
	engines["rdma"] = newPeerEngine
	delete(unavailable, "tcp")
	delete(unavailable, "rdma")
}

// Names --spawn gives the two daemons and the exported segment when the
// jobs name no target.
const (
	SpawnTargetID = "tcbench-a" // daemon A, which exports the target
	SpawnClientID = "tcbench-b" // daemon B, whose clients run the jobs
	SpawnSegment  = "tcbench"
)

// DaemonPeerConns is tensorcastd's default number of connections per peer
// (peer_conns): the iperf3 -P the tcp baseline uses.
const DaemonPeerConns = 4

func isPeerEngine(name string) bool { return name == "tcp" || name == "rdma" }

// PeerSpawn is what SpawnPeers starts.
type PeerSpawn struct {
	Bin      string
	PoolSize uint64
	// Host is the address both peer planes listen on (port 0); "" is
	// 127.0.0.1.
	Host string
	// RDMA is the daemons' rdma setting: off for tcp jobs, on for rdma.
	RDMA string
	// RDMADevice and RDMAGID are the daemons' rdma_device and rdma_gid
	// ("": their defaults).
	RDMADevice, RDMAGID string
	// Jobs are the run's jobs; the tcp and rdma ones size the exports.
	Jobs []*Job
}

// PeerPair is two spawned, connected daemons. A client of A (held here)
// registers one buffer per target the jobs name and exports it; B knows A
// as a peer and serves the jobs. Stop stops B, closes the client (ending
// the exports) and stops A.
type PeerPair struct {
	A, B   *Daemon
	Target string            // the default target: A's id / SpawnSegment
	Mem    map[string][]byte // target name → its buffer as mapped here
	ctl    *client.Client
	keyDir string
}

// SpawnPeers starts daemon A with a peer plane on s.Host, reads the address
// it bound from Hello, exports the jobs' targets there, then starts B
// with A as its peer. A accepts any peer holding the cluster key, which
// both read from a 0600 file in a private directory.
func SpawnPeers(s PeerSpawn, log *slog.Logger) (p *PeerPair, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	host := s.Host
	if host == "" {
		host = "127.0.0.1"
	}
	listen := net.JoinHostPort(host, "0")
	aID, sizes, inPool := SpawnTargetID, map[string]uint64{}, map[string]bool{}
	for _, j := range s.Jobs {
		if !isPeerEngine(j.Engine) {
			continue
		}
		t := j.Target
		if t == "" {
			t = SpawnTargetID + "/" + SpawnSegment
		}
		aID, _, _ = strings.Cut(t, "/")
		sizes[t] = max(sizes[t], uint64(j.NumJobs)*j.Size)
		inPool[t] = inPool[t] || j.PoolMem()
	}
	bID := SpawnClientID
	if aID == bID {
		bID = SpawnClientID + "-2"
	}
	p = &PeerPair{Target: aID + "/" + SpawnSegment, Mem: map[string][]byte{}}
	defer func() {
		if err != nil {
			p.Stop()
		}
	}()
	p.keyDir, err = os.MkdirTemp("", "tcbench-cluster-")
	if err != nil {
		return p, fmt.Errorf("%w: %w", ErrDaemon, err)
	}
	var raw [32]byte
	rand.Read(raw[:])
	keyFile := filepath.Join(p.keyDir, "cluster.key")
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(raw[:])+"\n"), 0o600); err != nil {
		return p, fmt.Errorf("%w: cluster key: %w", ErrDaemon, err)
	}
	common := []string{"--peer-listen", listen, "--cluster-key-file", keyFile, "--rdma", s.RDMA}
	if s.RDMADevice != "" {
		common = append(common, "--rdma-device", s.RDMADevice)
	}
	if s.RDMAGID != "" {
		common = append(common, "--rdma-gid", s.RDMAGID)
	}
	// A accepts only the daemons it lists: B, which dials in.
	p.A, err = spawnDaemon(s.Bin, s.PoolSize, nil, append([]string{"--daemon-id", aID, "--peer", bID + "="}, common...), log)
	if err != nil {
		return p, fmt.Errorf("daemon %s (%s): %w", aID, strings.Join(common, " "), err)
	}
	p.ctl, err = client.Dial(p.A.Socket, client.Options{Name: "tcbench-export"})
	if err != nil {
		return p, fmt.Errorf("%w: daemon %s: %w", ErrDaemon, aID, err)
	}
	addr := p.ctl.Hello().PeerAddr
	if addr == "" {
		return p, fmt.Errorf("%w: daemon %s reports no peer address", ErrDaemon, aID)
	}
	for t, size := range sizes {
		_, seg, _ := strings.Cut(t, "/")
		if inPool[t] {
			if p.Mem[t], err = exportPool(p.ctl, seg, size, client.RightRead|client.RightWrite); err != nil {
				return p, fmt.Errorf("%w: export %s on %s: %w", ErrDaemon, seg, aID, err)
			}
			continue
		}
		buf, err := p.ctl.RegisterBuffer(size)
		if err != nil {
			return p, fmt.Errorf("%w: target buffer of %d bytes on %s: %w", ErrDaemon, size, aID, err)
		}
		if _, err := p.ctl.ExportSegment(seg, buf.ID, 0, size, client.RightRead|client.RightWrite); err != nil {
			return p, fmt.Errorf("%w: export %s on %s: %w", ErrDaemon, seg, aID, err)
		}
		p.Mem[t] = buf.Mem
	}
	bArgs := append([]string{"--daemon-id", bID, "--peer", aID + "=" + addr}, common...)
	p.B, err = spawnDaemon(s.Bin, s.PoolSize, nil, bArgs, log)
	if err != nil {
		return p, fmt.Errorf("daemon %s (%s): %w", bID, strings.Join(bArgs, " "), err)
	}
	log.Info("spawned peer daemons", "target", aID, "peer_addr", addr, "client", bID, "rdma", s.RDMA)
	return p, nil
}

// exportPool exports size bytes of c's daemon's pool as seg with rights:
// contiguous blocks of the largest class, held by c (an RDMA-capable
// target: the pool is registered with the device, client buffers are
// not). It returns them as mapped here.
func exportPool(c *client.Client, seg string, size uint64, rights uint8) ([]byte, error) {
	pi, ok := c.Pool()
	if !ok {
		return nil, fmt.Errorf("the pool is not mapped")
	}
	blk := largestBlock(pi.BlockClasses)
	if blk == 0 {
		return nil, fmt.Errorf("the pool reports no block sizes")
	}
	n := (size + blk - 1) / blk
	offs, err := c.AllocBlocks(nil, int(n), blk)
	if err != nil {
		return nil, fmt.Errorf("%d pool blocks of %d bytes: %w", n, blk, err)
	}
	slices.Sort(offs)
	for i := 1; i < len(offs); i++ {
		if offs[i] != offs[i-1]+blk {
			return nil, fmt.Errorf("%w: the daemon gave pool blocks that are not contiguous (at %d and %d); use peer_mem=buffer", ErrBadValue, offs[i-1], offs[i])
		}
	}
	if _, err := c.ExportSegment(seg, pi.Segment, offs[0], size, rights); err != nil {
		return nil, err
	}
	return c.PoolBytes()[offs[0] : offs[0]+size], nil
}

// Env points env's tcp and rdma jobs at the pair.
func (p *PeerPair) Env(env *Env) {
	env.PeerSocket, env.PeerTarget, env.TargetMem = p.B.Socket, p.Target, p.Mem
}

// Stop stops B, ends the exports, stops A and removes the key.
func (p *PeerPair) Stop() error {
	var errs []error
	if p.B != nil {
		errs = append(errs, p.B.Stop())
		p.B = nil
	}
	if p.ctl != nil {
		errs = append(errs, p.ctl.Close())
		p.ctl = nil
	}
	if p.A != nil {
		errs = append(errs, p.A.Stop())
		p.A = nil
	}
	if p.keyDir != "" {
		errs = append(errs, os.RemoveAll(p.keyDir))
		p.keyDir = ""
	}
	p.Mem = nil
	return errors.Join(errs...)
}

// peerEngine runs a tcp or rdma job as a client of one daemon against a
// segment another daemon exports ("peer/segment"). The slots, and one
// scratch slot for prefill and read-back, are one client buffer (a sealed
// memfd) every connection registers (peer_mem=buffer, tcp's default) or
// pool blocks (peer_mem=pool, rdma's default: the pool is what the daemons
// register with an RDMA device); each connection opens the remote segment. A READ moves remote → slot, a WRITE slot → remote, carried by
// the daemons' peer plane (tcp, or RDMA when both daemons use it). Slots
// are dealt to lanes a batch at a time, as for uring. Clone w addresses
// [w*size, (w+1)*size) of the segment.
type peerEngine struct {
	env *Env
	job *Job
	dispatcher

	remoteName string // peer/segment the job opens
	base       uint64
	region     uint64
	slotSz     uint64
	slotMem    [][]byte // per slot: its buffer
	scrOff     uint64   // the scratch slot's offset in lane 0's local segment
	scrMem     []byte   // the scratch slot
	remote     []byte   // the target as mapped here (--spawn), or nil
	reqs       [1]xfer.Request
	res        [1]error
	opened     bool
}

var (
	_ Engine    = (*peerEngine)(nil)
	_ Peeker    = (*peerEngine)(nil)
	_ Prefiller = (*peerEngine)(nil)
)

func newPeerEngine(env *Env, job *Job) (Engine, error) {
	return &peerEngine{env: env, job: job}, nil
}

func (e *peerEngine) Name() string { return e.job.Engine }

func (e *peerEngine) Open(s EngineSpec) (err error) {
	if e.opened {
		return fmt.Errorf("%w: engine opened twice", ErrBadValue)
	}
	e.opened = true
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	j := e.job
	sock := j.Daemon
	e.remoteName = j.Target
	if e.env != nil {
		if e.env.PeerSocket != "" {
			sock = e.env.PeerSocket
		}
		if e.remoteName == "" {
			e.remoteName = e.env.PeerTarget
		}
	}
	if e.remoteName == "" {
		return fmt.Errorf("%w: engine %s needs a target (peer/segment)", ErrMissingOption, j.Engine)
	}
	e.slotSz, e.region = s.SlotSize, s.Region
	e.base = uint64(s.Worker) * s.Region
	if e.env != nil {
		if m := e.env.TargetMem[e.remoteName]; uint64(len(m)) >= e.base+s.Region {
			e.remote = m[e.base : e.base+s.Region]
		}
	}
	var rights uint8
	if j.RW.Reads() || e.remote == nil && j.Verify != "" {
		rights |= client.RightRead
	}
	if j.RW.Writes() || e.remote == nil && (j.RW.Reads() || j.Verify != "") {
		rights |= client.RightWrite // prefill writes the pattern
	}

	if err := e.dial(sock); err != nil {
		return err
	}
	e.slotMem = make([][]byte, s.Slots)
	slotOff := make([]uint64, s.Slots)
	if j.PoolMem() {
		err = e.poolSlots(s, slotOff)
	} else {
		err = e.bufferSlots(s, slotOff)
	}
	if err != nil {
		return err
	}
	rs, err := e.c.OpenRemote(e.remoteName, rights)
	if err != nil {
		return fmt.Errorf("%w: open %s on daemon %s: %w (the segment must be exported on that peer with these rights and the peer configured on this daemon; --spawn sets both up)",
			ErrNoTarget, e.remoteName, sock, err)
	}
	if rs.Size < e.base+s.Region {
		return fmt.Errorf("%w: %s is %d bytes; clone %d needs [%d, %d)", ErrBadValue, e.remoteName, rs.Size, s.Worker, e.base, e.base+s.Region)
	}
	e.dispatcher.target = rs.ID
	if j.Engine == "rdma" && j.PoolMem() && s.Slots > 0 {
		if err := e.untilRDMA(slotOff[0], rights); err != nil {
			return err
		}
	}
	e.targetBase = e.base
	return e.start(dispatchSpec{Slots: s.Slots, SlotSize: s.SlotSize, Region: s.Region, PartsPerIO: 1, SlotOff: slotOff})
}

// rdmaReadyWait bounds how long an rdma job waits for its requests to
// leave tcp.
var rdmaReadyWait = 20 * time.Second

// untilRDMA holds an rdma job until every connection's requests move by
// RDMA. The daemon sends a peer request over tcp until its link to the
// peer is up and the connection's remote segment resolved behind it, so
// the first requests of each connection go over tcp; a measurement that
// counted them would not be of rdma. Each connection repeats one small
// request on a slot of its own (a READ, or a WRITE when it may not read,
// before prefill lays the pattern down) until one moves less than its
// length over the daemon's tcp session with the peer. Past rdmaReadyWait
// the job fails: the daemons carry it over tcp.
func (e *peerEngine) untilRDMA(slotOff uint64, rights uint8) error {
	peer, _, _ := strings.Cut(e.remoteName, "/")
	n := min(e.slotSz, 4096, e.region)
	op := xfer.OpRead
	if rights&client.RightRead == 0 {
		op = xfer.OpWrite
	}
	deadline := time.Now().Add(rdmaReadyWait)
	res := make([]error, 1)
	req := []xfer.Request{{Op: op, Local: e.local, LocalOffset: slotOff, Target: e.dispatcher.target, TargetOffset: e.base, Length: n}}
	for tries := 1; ; tries++ {
		before, err := peerTCPBytes(e.c, peer)
		if err != nil {
			return err
		}
		if _, err := e.c.Transfer(req, waitTimeout, res); err != nil || res[0] != nil {
			return fmt.Errorf("%w: %s %d bytes (waiting for rdma): %w", ErrIO, op, n, errors.Join(err, res[0]))
		}
		after, err := peerTCPBytes(e.c, peer)
		if err != nil {
			return err
		}
		if after-before < n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: engine rdma: requests to %s still move over tcp after %v (%d tries): the daemons have no rdma link to that peer (rdma = on on both, an RDMA device, the target in the exporter's pool; see their logs)",
				ErrEngineUnavailable, peer, rdmaReadyWait, tries)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// peerTCPBytes is what the daemon moved over tcp to and from peer.
func peerTCPBytes(c *client.Client, peer string) (uint64, error) {
	ps, err := c.Peers()
	if err != nil {
		return 0, fmt.Errorf("%w: peers: %w", ErrEngineUnavailable, err)
	}
	for _, p := range ps {
		if p.ID == peer {
			return p.BytesIn + p.BytesOut, nil
		}
	}
	return 0, fmt.Errorf("%w: the daemon has no peer %q", ErrEngineUnavailable, peer)
}

// bufferSlots puts the slots and the scratch slot in one client buffer (a
// sealed memfd) the connection registers.
func (e *peerEngine) bufferSlots(s EngineSpec, slotOff []uint64) error {
	buf, err := slotBuffer(e.env, e.c, uint64(s.Slots+1)*s.SlotSize)
	if err != nil {
		return err
	}
	e.local = buf.ID
	for i := range slotOff {
		slotOff[i] = uint64(i) * s.SlotSize
		e.slotMem[i] = buf.Mem[slotOff[i] : slotOff[i]+s.SlotSize]
	}
	e.scrOff = uint64(s.Slots) * s.SlotSize
	e.scrMem = buf.Mem[e.scrOff : e.scrOff+s.SlotSize]
	return nil
}

// poolSlots puts each slot, and the scratch slot, in a pool block of the
// connection.
func (e *peerEngine) poolSlots(s EngineSpec, slotOff []uint64) error {
	pi, ok := e.c.Pool()
	if !ok {
		return fmt.Errorf("%w: the daemon's pool is not mapped", ErrEngineUnavailable)
	}
	if maxBlock := largestBlock(pi.BlockClasses); s.SlotSize > maxBlock {
		return fmt.Errorf("%w: bs %d is larger than the pool's largest block %d (use peer_mem=buffer)", ErrBadValue, s.SlotSize, maxBlock)
	}
	pool := e.c.PoolBytes()
	e.local = pi.Segment
	offs, err := e.c.AllocBlocks(nil, s.Slots+1, s.SlotSize)
	if err != nil {
		return fmt.Errorf("alloc %d pool blocks of %d bytes for slots: %w", s.Slots+1, s.SlotSize, err)
	}
	for k := range s.Slots {
		slotOff[k] = offs[k]
		e.slotMem[k] = pool[slotOff[k] : slotOff[k]+s.SlotSize]
	}
	e.scrOff = offs[s.Slots]
	e.scrMem = pool[e.scrOff : e.scrOff+s.SlotSize]
	return nil
}

func (e *peerEngine) Buffer(slot int) []byte { return e.slotMem[slot] }

// scratch moves [off, off+n) of the clone's window between the scratch
// slot and the remote segment with one Transfer on the connection (a
// control call beside the queue, made between the runner's IOs).
func (e *peerEngine) scratch(op xfer.Op, off, n uint64) ([]byte, error) {
	e.reqs[0] = xfer.Request{Op: op, Local: e.local, LocalOffset: e.scrOff,
		Target: e.dispatcher.target, TargetOffset: e.base + off, Length: n}
	if _, err := e.c.Transfer(e.reqs[:], waitTimeout, e.res[:]); err != nil {
		return nil, fmt.Errorf("%w: %s %d bytes at %d: %w", ErrIO, op, n, off, err)
	}
	if e.res[0] != nil {
		return nil, fmt.Errorf("%w: %s %d bytes at %d: %w", ErrIO, op, n, off, e.res[0])
	}
	return e.scrMem[:n], nil
}

// Peek returns the target bytes [off, off+n): from the mapping when this
// process exported the target, else read back through the daemons.
func (e *peerEngine) Peek(off, n uint64) ([]byte, error) {
	if e.c == nil || off > e.region || n > e.region-off || n > e.slotSz {
		return nil, fmt.Errorf("%w: peek out of bounds", ErrBadValue)
	}
	if e.remote != nil {
		return e.remote[off : off+n], nil
	}
	return e.scratch(xfer.OpRead, off, n)
}

// Prefill writes the verify pattern over the clone's window: directly when
// the target is mapped here, else by WRITEs of a slot's size.
func (e *peerEngine) Prefill(seed uint64, needPattern bool) error {
	if e.remote != nil {
		if !e.job.RW.Reads() {
			// Nothing reads the pattern: lay down another one, so that
			// verifying a write sees whether its bytes landed.
			seed = ^seed
		}
		fillPattern(e.remote, seed, 0)
		return nil
	}
	if !needPattern || !e.job.RW.Reads() {
		return nil // Open checked the segment covers the window
	}
	for off := uint64(0); off < e.region; off += e.slotSz {
		n := min(e.slotSz, e.region-off)
		fillPattern(e.scrMem[:n], seed, off)
		if _, err := e.scratch(xfer.OpWrite, off, n); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the queue and the connection (which closes the remote
// segment and releases the buffers in the daemon).
func (e *peerEngine) Close() error {
	errs := []error{e.closeQueue()}
	e.remote, e.slotMem, e.scrMem = nil, nil, nil
	return errors.Join(errs...)
}

// PeerEngineOf returns the engine of the jobs' tcp or rdma jobs ("" when
// there are none; SpawnCheck refuses a mix).
func PeerEngineOf(jobs []*Job) string {
	for _, j := range jobs {
		if isPeerEngine(j.Engine) {
			return j.Engine
		}
	}
	return ""
}

// NeedsOneDaemon reports whether some job runs through a single daemon
// (local, uring, store).
func NeedsOneDaemon(jobs []*Job) bool {
	for _, j := range jobs {
		if !isPeerEngine(j.Engine) && j.Engine != "mem" {
			return true
		}
	}
	return false
}
