package rdma

import (
	"fmt"
	"math/bits"
	"sync"
)

// DefaultChunkSize is how much of a segment one memory registration covers:
// large segments are registered as several MRs, in parallel.
const DefaultChunkSize = 1 << 30

// minChunkSize is the smallest chunk a region is registered in (the floor
// of Config.ChunkSize), and so the smallest a peer's region may claim: a
// request is split into a work request per chunk it touches, and a peer
// that claimed 1-byte chunks would turn each byte into one.
const minChunkSize = 4096

// keyTable maps offsets of a registered range to the keys of the chunk that
// covers them. Chunks are a power of two long and start at offset 0; the
// last one may be shorter. It is immutable after construction, so lookups
// take no lock.
type keyTable struct {
	addr  uint64 // address of offset 0
	size  uint64
	shift uint // log2 of the chunk size
	lkeys []uint32
	rkeys []uint32
	// base and limit, when limit is not zero, make the table a window:
	// offsets [0, limit) address [base, base+limit) of the range.
	base, limit uint64
}

func newKeyTable(addr, size, chunk uint64) (keyTable, error) {
	if size == 0 || chunk == 0 || chunk&(chunk-1) != 0 {
		return keyTable{}, fmt.Errorf("%w: size %d, chunk %d (a power of two)", ErrNotRegistered, size, chunk)
	}
	if addr+size < addr {
		return keyTable{}, fmt.Errorf("%w: range %#x+%d wraps", ErrNotRegistered, addr, size)
	}
	n := (size + chunk - 1) / chunk
	return keyTable{
		addr:  addr,
		size:  size,
		shift: uint(bits.TrailingZeros64(chunk)),
		lkeys: make([]uint32, n),
		rkeys: make([]uint32, n),
	}, nil
}

func (t *keyTable) chunks() int       { return len(t.rkeys) }
func (t *keyTable) chunkSize() uint64 { return 1 << t.shift }

// chunkRange is the [off, off+n) of chunk i.
func (t *keyTable) chunkRange(i int) (off, n uint64) {
	off = uint64(i) << t.shift
	n = min(t.chunkSize(), t.size-off)
	return off, n
}

// lookup resolves [off, off+n): the address of off, the keys of the chunk
// holding it and how many of the n bytes that chunk covers (span <= n; the
// caller continues at off+span). ok is false when the range is not inside
// the table.
func (t *keyTable) lookup(off, n uint64) (addr uint64, lkey, rkey uint32, span uint64, ok bool) {
	if t.limit != 0 {
		if n == 0 || off >= t.limit || n > t.limit-off {
			return 0, 0, 0, 0, false
		}
		off += t.base
	}
	if n == 0 || off >= t.size || n > t.size-off {
		return 0, 0, 0, 0, false
	}
	i := off >> t.shift
	end := (i + 1) << t.shift
	span = n
	if end-off < n {
		span = end - off
	}
	return t.addr + off, t.lkeys[i], t.rkeys[i], span, true
}

// Access is what a region's MRs let the peer do. Local use (the local side
// of a READ or WRITE) is always allowed.
type Access uint8

const (
	// AccessLocal grants the peer nothing: its rkeys are refused.
	AccessLocal Access = 0
	// AccessRemoteRead lets the peer RDMA READ the region.
	AccessRemoteRead Access = 1 << 0
	// AccessRemoteWrite lets the peer RDMA WRITE the region.
	AccessRemoteWrite Access = 1 << 1
	// AccessRemote is both.
	AccessRemote = AccessRemoteRead | AccessRemoteWrite
)

// String names the access: "local", "remote-read", "remote-write" or
// "remote-read+write".
func (a Access) String() string {
	switch a {
	case AccessLocal:
		return "local"
	case AccessRemoteRead:
		return "remote-read"
	case AccessRemoteWrite:
		return "remote-write"
	case AccessRemote:
		return "remote-read+write"
	}
	return fmt.Sprintf("access(%#x)", uint8(a))
}

// Region is a local segment's memory registration: one MR per chunk. The
// hot path only looks ranges up; registering happens once per segment.
type Region struct {
	keys   keyTable
	access Access
	// handles are the verbs layer's MR pointers, one per chunk; dereg
	// releases one.
	handles []any
	dereg   DeregisterFunc
}

// Addr is the address of the region's first byte.
func (r *Region) Addr() uint64 { return r.keys.addr }

// Size is the region's length in bytes.
func (r *Region) Size() uint64 { return r.keys.size }

// Access is what the region's MRs let the peer do.
func (r *Region) Access() Access { return r.access }

// Chunks is how many MRs back the region.
func (r *Region) Chunks() int { return r.keys.chunks() }

// Lookup resolves [off, off+n) of the region (see keyTable.lookup).
func (r *Region) Lookup(off, n uint64) (addr uint64, lkey, rkey uint32, span uint64, ok bool) {
	return r.keys.lookup(off, n)
}

// Remote describes the region for a peer: what it needs to address it with
// one-sided operations.
func (r *Region) Remote(name uint64) RemoteRegion {
	return RemoteRegion{
		Name:      name,
		Addr:      r.keys.addr,
		Size:      r.keys.size,
		ChunkSize: r.keys.chunkSize(),
		RKeys:     append([]uint32(nil), r.keys.rkeys...),
	}
}

// registerRegion registers [addr, addr+size) chunk by chunk on up to
// workers goroutines (all of them joined before it returns). On any failure
// the chunks already registered are released and the first error returned.
func registerRegion(addr, size, chunk uint64, workers int, reg RegisterFunc, dereg DeregisterFunc) (*Region, error) {
	keys, err := newKeyTable(addr, size, chunk)
	if err != nil {
		return nil, err
	}
	r := &Region{keys: keys, handles: make([]any, keys.chunks()), dereg: dereg}
	errs := make([]error, keys.chunks())
	workers = max(1, min(workers, keys.chunks()))
	next := make(chan int, keys.chunks())
	for i := range keys.chunks() {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				off, n := keys.chunkRange(i)
				r.keys.lkeys[i], r.keys.rkeys[i], r.handles[i], errs[i] = reg(off, n)
			}
		}()
	}
	wg.Wait()
	var first error
	for i, e := range errs {
		if e != nil && first == nil {
			first = fmt.Errorf("registering chunk %d of %d: %w", i, keys.chunks(), e)
		}
	}
	if first != nil {
		for i, e := range errs {
			if e == nil {
				_ = dereg(r.handles[i])
			}
		}
		return nil, first
	}
	return r, nil
}

// Release deregisters every chunk with the DeregisterFunc the region was
// made with and returns the first error; a second call releases nothing.
// Device.Deregister calls it; call it only on a region from NewRegion.
func (r *Region) Release() error {
	var first error
	for i, h := range r.handles {
		if h == nil {
			continue
		}
		if err := r.dereg(h); err != nil && first == nil {
			first = err
		}
		r.handles[i] = nil
	}
	return first
}

// RemoteRegion is a peer's registered region as the peer described it in
// its connection data: enough to address it with RDMA READ and WRITE.
type RemoteRegion struct {
	// Name is the peer's identifier for the region (its segment id).
	Name      uint64
	Addr      uint64
	Size      uint64
	ChunkSize uint64
	RKeys     []uint32
}

// table builds the lookup table of a remote region, checking that its
// fields agree.
func (r RemoteRegion) table() (keyTable, error) {
	// Check the key count before building anything: Size and ChunkSize come
	// from the peer, and their quotient must not size an allocation.
	if r.ChunkSize < minChunkSize || r.ChunkSize&(r.ChunkSize-1) != 0 {
		return keyTable{}, fmt.Errorf("%w: chunk size %d is not a power of two of at least %d", ErrNotRegistered, r.ChunkSize, minChunkSize)
	}
	if n := r.Size/r.ChunkSize + min(r.Size%r.ChunkSize, 1); n != uint64(len(r.RKeys)) {
		return keyTable{}, fmt.Errorf("%w: %d rkeys for %d chunks", ErrNotRegistered, len(r.RKeys), n)
	}
	t, err := newKeyTable(r.Addr, r.Size, r.ChunkSize)
	if err != nil {
		return keyTable{}, err
	}
	if len(r.RKeys) != t.chunks() {
		return keyTable{}, fmt.Errorf("%w: %d rkeys for %d chunks", ErrNotRegistered, len(r.RKeys), t.chunks())
	}
	copy(t.rkeys, r.RKeys)
	return t, nil
}
