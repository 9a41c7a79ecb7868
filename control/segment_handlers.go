package control

// The handlers of segments and pool blocks: RegisterBuffer, RegisterFile,
// UnregisterBuffer, PoolInfo, AllocBlocks and FreeBlocks.

import (
	"fmt"
	"slices"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

func (c *conn) segments() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.buffers) + len(c.files)
}

func (c *conn) registerBuffer(m *wire.RegisterBufferRequest) error {
	fd, err := c.takeFD()
	if err != nil {
		return err
	}
	lim := &c.s.cfg.Limits
	if m.Size == 0 || m.Size > lim.MaxBufferSize {
		closeFDs([]int{fd})
		return fmt.Errorf("%w: buffer of %d bytes (max %d)", ErrLimit, m.Size, lim.MaxBufferSize)
	}
	if c.segments() >= lim.MaxBuffers {
		closeFDs([]int{fd})
		return fmt.Errorf("%w: %d segments held", ErrLimit, lim.MaxBuffers)
	}
	reg := c.s.deps.Registry
	id := reg.NextID()
	buf, err := c.s.deps.MapBuffer(id, fd, m.Size, lim.MaxBufferSize)
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
	wire.SetResponse[wire.RegisterBufferResponse](&c.resp).Segment = uint64(id)
	return nil
}

func (c *conn) registerFile(m *wire.RegisterFileRequest) error {
	op := c.s.deps.FileOpener
	if op == nil {
		return fmt.Errorf("%w: no file opener configured", ErrUnavailable)
	}
	if c.segments() >= c.s.cfg.Limits.MaxBuffers {
		return fmt.Errorf("%w: %d segments held", ErrLimit, c.s.cfg.Limits.MaxBuffers)
	}
	reg := c.s.deps.Registry
	id := reg.NextID()
	var f FileSegment
	var err error
	if to, ok := op.(TenantFileOpener); ok {
		name := ""
		if c.tenant != nil {
			name = c.tenant.Name
		}
		f, err = to.OpenFileFor(name, id, string(m.Path), m.Direct, m.Size)
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
	r := wire.SetResponse[wire.RegisterFileResponse](&c.resp)
	r.Segment, r.Size = uint64(id), f.Size()
	return nil
}

func (c *conn) unregister(m *wire.UnregisterBufferRequest) error {
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
	c.s.deps.Registry.Remove(id)
	wire.SetResponse[wire.UnregisterBufferResponse](&c.resp)
	if isBuf {
		return b.Close()
	}
	return f.Close()
}

// errNoPool answers the pool calls of a connection without a tenant.
var errNoPool = fmt.Errorf("%w: this user is in no tenant, so it has no pool", ErrPermission)

// poolInfo answers with the connection's tenant's pool and passes its memfd:
// the only pool this client can map.
func (c *conn) poolInfo() (int, error) {
	p := c.pool
	if p == nil {
		return -1, errNoPool
	}
	r := wire.SetResponse[wire.PoolInfoResponse](&c.resp)
	r.Segment, r.Size, r.BlockClasses = uint64(p.ID()), p.Size(), blockClasses(p)
	return p.Fd(), nil
}

func (c *conn) allocBlocks(m *wire.AllocBlocksRequest) error {
	n := int(m.N)
	if n == 0 || m.Size == 0 {
		return fmt.Errorf("%w: %d blocks of %d bytes", ErrMalformed, n, m.Size)
	}
	if c.blocks.len()+n > c.s.cfg.Limits.MaxBlocks {
		return fmt.Errorf("%w: %d blocks held, %d asked (max %d)", ErrLimit, c.blocks.len(), n, c.s.cfg.Limits.MaxBlocks)
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
		c.blocks.add(off, size)
	}
	wire.SetResponse[wire.AllocBlocksResponse](&c.resp).Offsets = offs
	return nil
}

func (c *conn) freeBlocks(m *wire.FreeBlocksRequest) {
	c.codes = c.codes[:0]
	p := c.pool
	for _, off := range m.Offsets {
		i, held := slices.BinarySearch(c.blocks.offs, off)
		if !held {
			c.codes = append(c.codes, tcproto.CodeNOT_FOUND)
			continue
		}
		if c.exported(p.ID(), off, c.blocks.sizes[i]) {
			// Peers may be writing into it: unexport first.
			c.codes = append(c.codes, tcproto.CodeFAILED_PRECONDITION)
			continue
		}
		if c.pview.busy(off) {
			// A transfer of this connection still moves bytes in it
			// (possibly past its deadline): free it once that ends.
			c.codes = append(c.codes, tcproto.CodeBUSY)
			continue
		}
		err := p.Free(off)
		if err == nil {
			c.blocks.remove(off)
		}
		c.codes = append(c.codes, status.CodeOf(err))
	}
	wire.SetResponse[wire.FreeBlocksResponse](&c.resp).Codes = c.codes
}
