package client

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Ping makes one round trip carrying payload and checks it comes back.
func (c *Client) Ping(payload []byte, opts ...CallOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.PingRequest](c.start(opts)).Payload = payload
	r, err := call[wire.PingResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	if string(r.Payload) != string(payload) {
		return c.fail(fmt.Errorf("%w: ping payload changed", ErrProtocol))
	}
	return nil
}

// RegisterBuffer creates a sealed memfd of size bytes, maps it here (its
// whole 2 MiB spans on transparent huge pages where the kernel gives them)
// and registers it with the daemon. The mapping lives until UnregisterBuffer or
// Close.
func (c *Client) RegisterBuffer(size uint64, opts ...CallOption) (*Buffer, error) {
	if !sharedMemory {
		return nil, fmt.Errorf("%w: memfd buffers need Linux", ErrNotSupported)
	}
	fd, err := shm.NewMemfd("tensorcast-client", size, true)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	mem, err := shm.MapShared(fd, size)
	if err != nil {
		return nil, err
	}
	// On 2 MiB pages, as the pool is: the daemon's copies into and out of
	// the buffer, and a disk's DMA, then take one page-table entry (and
	// one segment) per 2 MiB. Where the kernel places none, the buffer
	// works on normal pages (Buffer.Huge says which).
	done, _, _ := shm.Collapse(mem)
	id, err := c.RegisterFD(fd, size, opts...)
	if err != nil {
		shm.Unmap(mem)
		return nil, err
	}
	c.mu.Lock()
	c.buffers[id] = mem
	c.mu.Unlock()
	return &Buffer{ID: id, Mem: mem, Huge: uint64(done) * shm.HugepageSize}, nil
}

// RegisterFD registers size bytes of fd (a memfd, or a file on tmpfs or
// hugetlbfs) as a client buffer. The caller keeps fd: the daemon gets its
// own copy. A memfd that allows sealing is sealed against shrinking by the
// daemon; one that cannot be sealed is taken unsealed, on the terms of
// shm/doc.go (a request that faults on it because the caller shrank it
// fails with ErrFailedPrecondition; TCP transfers and exports refuse it).
func (c *Client) RegisterFD(fd int, size uint64, opts ...CallOption) (xfer.SegmentID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.RegisterBufferRequest](c.start(opts)).Size = size
	r, err := call[wire.RegisterBufferResponse](c, fd, nil)
	if err != nil {
		return 0, err
	}
	return xfer.SegmentID(r.Segment), nil
}

// UnregisterBuffer unregisters a buffer or file segment; a buffer this
// client created is unmapped too.
func (c *Client) UnregisterBuffer(id xfer.SegmentID, opts ...CallOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.UnregisterBufferRequest](c.start(opts)).Segment = uint64(id)
	if _, err := call[wire.UnregisterBufferResponse](c, noFD, nil); err != nil {
		return err
	}
	if mem, ok := c.buffers[id]; ok {
		delete(c.buffers, id)
		return shm.Unmap(mem)
	}
	return nil
}

// RegisterFile asks the daemon to open path (O_DIRECT with direct) as a
// file segment of size bytes (0: the file's size); it returns the segment
// and its size.
func (c *Client) RegisterFile(path string, direct bool, size uint64, opts ...CallOption) (xfer.SegmentID, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.RegisterFileRequest](c.start(opts)) = wire.RegisterFileRequest{Path: []byte(path), Direct: direct, Size: size}
	r, err := call[wire.RegisterFileResponse](c, noFD, nil)
	if err != nil {
		return 0, 0, err
	}
	return xfer.SegmentID(r.Segment), r.Size, nil
}

// AllocBlocks allocates n pool blocks of size bytes, all or nothing, and
// appends their offsets in the pool to dst.
func (c *Client) AllocBlocks(dst []uint64, n int, size uint64, opts ...CallOption) ([]uint64, error) {
	if n <= 0 || n > 1<<31 {
		return dst, fmt.Errorf("%w: %d blocks", ErrInvalidArgument, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.AllocBlocksRequest](c.start(opts)) = wire.AllocBlocksRequest{N: uint32(n), Size: size}
	r, err := call[wire.AllocBlocksResponse](c, noFD, nil)
	if err != nil {
		return dst, err
	}
	if err := c.positional(len(r.Offsets), n); err != nil {
		return dst, err
	}
	for _, off := range r.Offsets {
		if c.poolMem != nil && (off >= uint64(len(c.poolMem)) || size > uint64(len(c.poolMem))-off) {
			return dst, c.fail(fmt.Errorf("%w: block %d+%d outside the pool", ErrProtocol, off, size))
		}
	}
	return append(dst, r.Offsets...), nil
}

// FreeBlocks frees pool blocks; results[i] is nil or why offs[i] was not
// freed. results must have len(offs) elements.
func (c *Client) FreeBlocks(offs []uint64, results []error, opts ...CallOption) error {
	if len(results) != len(offs) {
		return fmt.Errorf("%w: %d results for %d offsets", ErrInvalidArgument, len(results), len(offs))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.FreeBlocksRequest](c.start(opts)).Offsets = offs
	r, err := call[wire.FreeBlocksResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	return c.itemResults(r.Codes, results)
}

// AllocBatch allocates a batch of up to capacity tasks.
func (c *Client) AllocBatch(capacity int, opts ...CallOption) (xfer.BatchID, error) {
	if capacity <= 0 || capacity > 1<<31 {
		return 0, fmt.Errorf("%w: capacity %d", ErrInvalidArgument, capacity)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.AllocBatchRequest](c.start(opts)).Capacity = uint32(capacity)
	r, err := call[wire.AllocBatchResponse](c, noFD, nil)
	if err != nil {
		return 0, err
	}
	return xfer.BatchID(r.Batch), nil
}

// Submit adds reqs to batch in one message; results[i] is nil when reqs[i]
// was accepted, or why it was refused. results must have len(reqs)
// elements. A refused request still takes its task index.
func (c *Client) Submit(batch xfer.BatchID, reqs []xfer.Request, results []error, opts ...CallOption) error {
	return c.submit(batch, reqs, nil, results, opts)
}

func (c *Client) submit(batch xfer.BatchID, reqs []xfer.Request, notify [][]byte, results []error, opts []CallOption) error {
	if len(results) != len(reqs) || len(reqs) == 0 {
		return fmt.Errorf("%w: %d results for %d requests", ErrInvalidArgument, len(results), len(reqs))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.SubmitRequest](c.start(opts)) = wire.SubmitRequest{Batch: uint64(batch), Requests: reqs, Notify: notify}
	r, err := call[wire.SubmitResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	return c.itemResults(r.Codes, results)
}

// TaskStatus returns task i of batch.
func (c *Client) TaskStatus(batch xfer.BatchID, i int, opts ...CallOption) (TaskStatus, error) {
	if i < 0 || i > 1<<31 {
		return TaskStatus{}, fmt.Errorf("%w: task %d", ErrInvalidArgument, i)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.TaskStatusRequest](c.start(opts)) = wire.TaskStatusRequest{Batch: uint64(batch), Index: uint32(i)}
	r, err := call[wire.TaskStatusResponse](c, noFD, nil)
	if err != nil {
		return TaskStatus{}, err
	}
	st, ok := completionState(uint32(r.State))
	if !ok {
		return TaskStatus{}, fmt.Errorf("%w: task state %d", ErrProtocol, r.State)
	}
	return TaskStatus{State: st, Transferred: r.Transferred, Err: itemErr(r.Code)}, nil
}

// BatchStatus returns batch's summary.
func (c *Client) BatchStatus(batch xfer.BatchID, opts ...CallOption) (Summary, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.BatchStatusRequest](c.start(opts)).Batch = uint64(batch)
	r, err := call[wire.BatchStatusResponse](c, noFD, nil)
	if err != nil {
		return Summary{}, err
	}
	return r.Summary, nil
}

// Wait waits up to timeout (0: the call's deadline, else the daemon's
// default) for batch's tasks to end and returns its summary;
// Waiting+Pending > 0 means time ran out.
func (c *Client) Wait(batch xfer.BatchID, timeout time.Duration, opts ...CallOption) (Summary, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.WaitRequest](c.start(opts)) = wire.WaitRequest{Batch: uint64(batch), TimeoutMS: millis(timeout)}
	c.holdFor(timeout)
	r, err := call[wire.WaitResponse](c, noFD, nil)
	if err != nil {
		return Summary{}, err
	}
	return r.Summary, nil
}

// FreeBatch frees batch; it fails with ErrBusy while tasks are live.
func (c *Client) FreeBatch(batch xfer.BatchID, opts ...CallOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.FreeBatchRequest](c.start(opts)).Batch = uint64(batch)
	_, err := call[wire.FreeBatchResponse](c, noFD, nil)
	return err
}

// Transfer runs reqs in one message: the daemon allocates a batch, submits,
// waits up to timeout (0: the call's deadline, else the daemon's default)
// and frees it. results[i] is nil when reqs[i] completed, else why not;
// results must have len(reqs) elements.
func (c *Client) Transfer(reqs []xfer.Request, timeout time.Duration, results []error, opts ...CallOption) (Summary, error) {
	return c.transfer(reqs, nil, timeout, results, opts)
}

func (c *Client) transfer(reqs []xfer.Request, notify [][]byte, timeout time.Duration, results []error, opts []CallOption) (Summary, error) {
	if len(results) != len(reqs) || len(reqs) == 0 {
		return Summary{}, fmt.Errorf("%w: %d results for %d requests", ErrInvalidArgument, len(results), len(reqs))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.TransferRequestBody](c.start(opts)) = wire.TransferRequestBody{Requests: reqs, TimeoutMS: millis(timeout),
		Notify: notify}
	c.holdFor(timeout)
	r, err := call[wire.TransferResponse](c, noFD, nil)
	if err != nil {
		return Summary{}, err
	}
	if err := c.positional(len(r.States), len(reqs)); err != nil {
		return Summary{}, err
	}
	if err := c.itemResults(r.Codes, results); err != nil {
		return Summary{}, err
	}
	return r.Summary, nil
}

// Stats returns the daemon's counters.
func (c *Client) Stats(opts ...CallOption) (Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.StatsRequest](c.start(opts))
	r, err := call[wire.StatsResponse](c, noFD, nil)
	if err != nil {
		return Stats{}, err
	}
	return Stats{Pool: append(r.Pool[:0:0], r.Pool...), Engine: append(r.Engine[:0:0], r.Engine...),
		Connection: append(r.Connection[:0:0], r.Connection...), Transports: append(r.Transports[:0:0], r.Transports...),
		Store: append(r.Store[:0:0], r.Store...), Connections: int(r.Connections)}, nil
}

// positional checks that a per-item answer has one result per item.
func (c *Client) positional(got, want int) error {
	if got != want {
		return c.fail(fmt.Errorf("%w: %d results for %d items", ErrProtocol, got, want))
	}
	return nil
}

// itemResults turns an answer's per-item codes into results, after checking
// there is one per item.
func (c *Client) itemResults(codes []wire.Code, results []error) error {
	if err := c.positional(len(codes), len(results)); err != nil {
		return err
	}
	for i, code := range codes {
		results[i] = itemErr(code)
	}
	return nil
}

func millis(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	ms := d / time.Millisecond
	if ms == 0 {
		ms = 1
	}
	if ms > 1<<31 {
		ms = 1 << 31
	}
	return uint32(ms)
}
