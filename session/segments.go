package session

// The handlers of segments and pool blocks: RegisterBuffer, RegisterFile,
// UnregisterBuffer, PoolInfo, AllocBlocks and FreeBlocks.

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

func (c *Session) segments() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.buffers) + len(c.files)
}

// RegisterBuffer maps the client's memfd fd as a buffer segment of the
// session and logs how it is kept from shrinking (shm.Sealing), if it is.
// It takes fd, whatever it returns.
func (c *Session) RegisterBuffer(m *wire.RegisterBufferRequest, fd int, r *wire.Response) error {
	lim := &c.h.Limits
	if m.Size == 0 || m.Size > lim.MaxBufferSize {
		unix.Close(fd) //nolint:errcheck // nothing to do about it
		return fmt.Errorf("%w: buffer of %d bytes (max %d)", ErrLimit, m.Size, lim.MaxBufferSize)
	}
	if c.segments() >= lim.MaxBuffers {
		unix.Close(fd) //nolint:errcheck // nothing to do about it
		return fmt.Errorf("%w: %d segments held", ErrLimit, lim.MaxBuffers)
	}
	reg := c.h.Registry
	id := reg.NextID()
	buf, err := c.h.MapBuffer(id, fd, m.Size, lim.MaxBufferSize)
	if err != nil {
		return err
	}
	if err := reg.Add(buf); err != nil {
		buf.Close()
		return err
	}
	c.mu.Lock()
	c.buffers[id] = buf
	c.mu.Unlock()
	if s, ok := buf.(interface{ Sealing() shm.Sealing }); ok {
		// Unsealed: every copy of it is guarded and peers' paths refuse
		// it (see package shm). A buffer the client sealed, as the
		// libraries do, is the usual case: a line of its own only in the
		// debug log, since a client registers as often as it likes
		// (480,000 lines an hour in a soak).
		level := slog.LevelInfo
		if s.Sealing() == shm.SealedByClient {
			level = slog.LevelDebug
		}
		c.log.Log(context.Background(), level, "buffer registered", "segment", uint64(id), "size", m.Size, "sealing", s.Sealing().String())
	}
	wire.SetResponse[wire.RegisterBufferResponse](r).Segment = uint64(id)
	return nil
}

// RegisterFile opens a file as a segment of the session.
func (c *Session) RegisterFile(m *wire.RegisterFileRequest, r *wire.Response) error {
	op := c.h.FileOpener
	if op == nil {
		return fmt.Errorf("%w: no file opener configured", ErrUnavailable)
	}
	if c.segments() >= c.h.Limits.MaxBuffers {
		return fmt.Errorf("%w: %d segments held", ErrLimit, c.h.Limits.MaxBuffers)
	}
	reg := c.h.Registry
	id := reg.NextID()
	var f FileSegment
	var err error
	if to, ok := op.(TenantFileOpener); ok {
		f, err = to.OpenFileFor(c.tenant, id, string(m.Path), m.Direct, m.Size)
	} else {
		f, err = op.OpenFile(id, string(m.Path), m.Direct, m.Size)
	}
	if err != nil {
		return err
	}
	if err := reg.Add(f); err != nil {
		f.Close()
		return err
	}
	c.mu.Lock()
	c.files[id] = f
	c.mu.Unlock()
	a := wire.SetResponse[wire.RegisterFileResponse](r)
	a.Segment, a.Size = uint64(id), f.Size()
	return nil
}

// Unregister drops a buffer or file segment of the session.
func (c *Session) Unregister(m *wire.UnregisterBufferRequest, r *wire.Response) error {
	id := xfer.SegmentID(m.Segment)
	c.mu.Lock()
	b, isBuf := c.buffers[id]
	f, isFile := c.files[id]
	delete(c.buffers, id)
	delete(c.files, id)
	c.segGen.Add(1)
	c.mu.Unlock()
	if !isBuf && !isFile {
		return fmt.Errorf("%w: segment %d", ErrNotFound, id)
	}
	c.dropExportsOf(id)
	c.h.Registry.Remove(id)
	wire.SetResponse[wire.UnregisterBufferResponse](r)
	if isBuf {
		return b.Close()
	}
	return f.Close()
}

// errNoPool answers the pool calls of a connection without a tenant.
var errNoPool = fmt.Errorf("%w: this user is in no tenant, so it has no pool", ErrPermission)

// PoolInfo answers with the session's tenant's pool and returns its memfd
// to pass with the answer: the only pool this client can map.
func (c *Session) PoolInfo(r *wire.Response) (int, error) {
	p := c.pool
	if p == nil {
		return -1, errNoPool
	}
	a := wire.SetResponse[wire.PoolInfoResponse](r)
	a.Segment, a.Size, a.BlockClasses = uint64(p.ID()), p.Size(), blockClasses(p)
	return p.Fd(), nil
}

// AllocBlocks allocates pool blocks to the session.
func (c *Session) AllocBlocks(m *wire.AllocBlocksRequest, r *wire.Response) error {
	n := int(m.N)
	if n == 0 || m.Size == 0 {
		return fmt.Errorf("%w: %d blocks of %d bytes", ErrMalformed, n, m.Size)
	}
	if c.blocks.Len()+n > c.h.Limits.MaxBlocks {
		return fmt.Errorf("%w: %d blocks held, %d asked (max %d)", ErrLimit, c.blocks.Len(), n, c.h.Limits.MaxBlocks)
	}
	p := c.pool
	if p == nil {
		return errNoPool
	}
	c.offs = slices.Grow(c.offs[:0], n)[:n]
	offs := c.offs
	if err := p.AllocN(m.Size, offs); err != nil {
		return err
	}
	for _, off := range offs {
		size, ok := p.BlockSize(off)
		if !ok {
			size = m.Size
		}
		c.blocks.Add(off, size)
	}
	wire.SetResponse[wire.AllocBlocksResponse](r).Offsets = offs
	return nil
}

// FreeBlocks gives pool blocks of the session back, each on its own.
func (c *Session) FreeBlocks(m *wire.FreeBlocksRequest, r *wire.Response) {
	c.codes = c.codes[:0]
	p := c.pool
	for _, off := range m.Offsets {
		size, held := c.blocks.Find(off)
		if !held {
			c.codes = append(c.codes, tcproto.CodeNOT_FOUND)
			continue
		}
		if c.exported(p.ID(), off, size) {
			// Peers may be writing into it: unexport first.
			c.codes = append(c.codes, tcproto.CodeFAILED_PRECONDITION)
			continue
		}
		// Out of the session's blocks before the pool has it back, in
		// one step with the check: a request of this connection racing
		// the free finds no block to hold, and cannot move bytes in
		// memory another client may be given next. (The block is there:
		// Find found it above, and only this goroutine removes blocks.)
		if _, taken, _ := c.blocks.TakeIdle(off); !taken {
			// A transfer of this connection still moves bytes in it
			// (possibly past its deadline): free it once that ends.
			c.codes = append(c.codes, tcproto.CodeBUSY)
			continue
		}
		err := p.Free(off)
		if err != nil {
			c.blocks.Add(off, size) // still the session's: the pool did not take it
		}
		c.codes = append(c.codes, status.CodeOf(err))
	}
	wire.SetResponse[wire.FreeBlocksResponse](r).Codes = c.codes
}

// blockClasses returns the pool's block sizes, smallest first, when the
// pool reports them.
func blockClasses(p any) []uint64 {
	s, ok := p.(interface{ Stats() shm.PoolStats })
	if !ok {
		return nil
	}
	cl := s.Stats().Classes
	out := make([]uint64, len(cl))
	for i := range cl {
		out[i] = cl[i].BlockSize
	}
	return out
}
