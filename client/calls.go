package client

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// Ping makes one round trip carrying payload and checks it comes back.
func (c *Client) Ping(payload []byte, opts ...CallOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyPingRequest, opts)
	c.req.Payload = payload
	if err := c.roundTrip(tcproto.ResponseBodyPingResponse, -1, nil); err != nil {
		return err
	}
	if string(c.resp.Payload) != string(payload) {
		return c.fail(fmt.Errorf("%w: ping payload changed", ErrProtocol))
	}
	return nil
}

// RegisterBuffer creates a sealed memfd of size bytes, maps it here and
// registers it with the daemon. The mapping lives until UnregisterBuffer or
// Close.
func (c *Client) RegisterBuffer(size uint64, opts ...CallOption) (*Buffer, error) {
	fd, err := shm.NewMemfd("tensorcast-client", size, true)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	mem, err := shm.MapShared(fd, size)
	if err != nil {
		return nil, err
	}
	id, err := c.RegisterFD(fd, size, opts...)
	if err != nil {
		shm.Unmap(mem)
		return nil, err
	}
	c.mu.Lock()
	c.buffers[id] = mem
	c.mu.Unlock()
	return &Buffer{ID: id, Mem: mem}, nil
}

// RegisterFD registers size bytes of fd (a memfd sealed against shrinking,
// or a regular file) as a client buffer. The caller keeps fd: the daemon
// gets its own copy.
func (c *Client) RegisterFD(fd int, size uint64, opts ...CallOption) (xfer.SegmentID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyRegisterBufferRequest, opts)
	c.req.Size = size
	if err := c.roundTrip(tcproto.ResponseBodyRegisterBufferResponse, fd, nil); err != nil {
		return 0, err
	}
	return xfer.SegmentID(c.resp.Segment), nil
}

// UnregisterBuffer unregisters a buffer or file segment; a buffer this
// client created is unmapped too.
func (c *Client) UnregisterBuffer(id xfer.SegmentID, opts ...CallOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyUnregisterBufferRequest, opts)
	c.req.Segment = uint64(id)
	if err := c.roundTrip(tcproto.ResponseBodyUnregisterBufferResponse, -1, nil); err != nil {
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
	c.start(tcproto.RequestBodyRegisterFileRequest, opts)
	c.req.Name = []byte(path)
	c.req.Direct = direct
	c.req.Size = size
	if err := c.roundTrip(tcproto.ResponseBodyRegisterFileResponse, -1, nil); err != nil {
		return 0, 0, err
	}
	return xfer.SegmentID(c.resp.Segment), c.resp.Size, nil
}

// AllocBlocks allocates n pool blocks of size bytes, all or nothing, and
// appends their offsets in the pool to dst.
func (c *Client) AllocBlocks(dst []uint64, n int, size uint64, opts ...CallOption) ([]uint64, error) {
	if n <= 0 || n > 1<<31 {
		return dst, fmt.Errorf("%w: %d blocks", ErrInvalidArgument, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyAllocBlocksRequest, opts)
	c.req.N = uint32(n)
	c.req.Size = size
	if err := c.roundTrip(tcproto.ResponseBodyAllocBlocksResponse, -1, nil); err != nil {
		return dst, err
	}
	if err := c.positional(len(c.resp.Offsets), n); err != nil {
		return dst, err
	}
	for _, off := range c.resp.Offsets {
		if c.poolMem != nil && (off >= uint64(len(c.poolMem)) || size > uint64(len(c.poolMem))-off) {
			return dst, c.fail(fmt.Errorf("%w: block %d+%d outside the pool", ErrProtocol, off, size))
		}
	}
	return append(dst, c.resp.Offsets...), nil
}

// FreeBlocks frees pool blocks; results[i] is nil or why offs[i] was not
// freed. results must have len(offs) elements.
func (c *Client) FreeBlocks(offs []uint64, results []error, opts ...CallOption) error {
	if len(results) != len(offs) {
		return fmt.Errorf("%w: %d results for %d offsets", ErrInvalidArgument, len(results), len(offs))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyFreeBlocksRequest, opts)
	c.req.Offsets = append(c.req.Offsets, offs...)
	if err := c.roundTrip(tcproto.ResponseBodyFreeBlocksResponse, -1, nil); err != nil {
		return err
	}
	if err := c.positional(len(c.resp.Codes), len(offs)); err != nil {
		return err
	}
	for i, code := range c.resp.Codes {
		results[i] = itemErr(code)
	}
	return nil
}

// AllocBatch allocates a batch of up to capacity tasks.
func (c *Client) AllocBatch(capacity int, opts ...CallOption) (xfer.BatchID, error) {
	if capacity <= 0 || capacity > 1<<31 {
		return 0, fmt.Errorf("%w: capacity %d", ErrInvalidArgument, capacity)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyAllocBatchRequest, opts)
	c.req.Capacity = uint32(capacity)
	if err := c.roundTrip(tcproto.ResponseBodyAllocBatchResponse, -1, nil); err != nil {
		return 0, err
	}
	return xfer.BatchID(c.resp.Batch), nil
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
	c.start(tcproto.RequestBodySubmitRequest, opts)
	c.req.Batch = uint64(batch)
	c.req.Requests = append(c.req.Requests, reqs...)
	c.req.Notify = notify
	if err := c.roundTrip(tcproto.ResponseBodySubmitResponse, -1, nil); err != nil {
		return err
	}
	if err := c.positional(len(c.resp.Codes), len(reqs)); err != nil {
		return err
	}
	for i, code := range c.resp.Codes {
		results[i] = itemErr(code)
	}
	return nil
}

// TaskStatus returns task i of batch.
func (c *Client) TaskStatus(batch xfer.BatchID, i int, opts ...CallOption) (TaskStatus, error) {
	if i < 0 || i > 1<<31 {
		return TaskStatus{}, fmt.Errorf("%w: task %d", ErrInvalidArgument, i)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyTaskStatusRequest, opts)
	c.req.Batch = uint64(batch)
	c.req.Index = uint32(i)
	if err := c.roundTrip(tcproto.ResponseBodyTaskStatusResponse, -1, nil); err != nil {
		return TaskStatus{}, err
	}
	t := c.resp.Task
	return TaskStatus{State: xfer.State(t.State), Transferred: t.Transferred, Err: itemErr(t.Code)}, nil
}

// BatchStatus returns batch's summary.
func (c *Client) BatchStatus(batch xfer.BatchID, opts ...CallOption) (Summary, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyBatchStatusRequest, opts)
	c.req.Batch = uint64(batch)
	if err := c.roundTrip(tcproto.ResponseBodyBatchStatusResponse, -1, nil); err != nil {
		return Summary{}, err
	}
	return c.resp.Summary, nil
}

// Wait waits up to timeout (0: the daemon's default) for batch's tasks to
// end and returns its summary; Waiting+Pending > 0 means time ran out.
func (c *Client) Wait(batch xfer.BatchID, timeout time.Duration, opts ...CallOption) (Summary, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyWaitRequest, opts)
	c.req.Batch = uint64(batch)
	c.req.TimeoutMS = millis(timeout)
	if err := c.roundTrip(tcproto.ResponseBodyWaitResponse, -1, nil); err != nil {
		return Summary{}, err
	}
	return c.resp.Summary, nil
}

// FreeBatch frees batch; it fails with ErrBusy while tasks are live.
func (c *Client) FreeBatch(batch xfer.BatchID, opts ...CallOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyFreeBatchRequest, opts)
	c.req.Batch = uint64(batch)
	return c.roundTrip(tcproto.ResponseBodyFreeBatchResponse, -1, nil)
}

// Transfer runs reqs in one message: the daemon allocates a batch, submits,
// waits up to timeout (0: the call's deadline or the daemon's default) and
// frees it. results[i] is nil when reqs[i] completed, else why not; results
// must have len(reqs) elements.
func (c *Client) Transfer(reqs []xfer.Request, timeout time.Duration, results []error, opts ...CallOption) (Summary, error) {
	return c.transfer(reqs, nil, timeout, results, opts)
}

func (c *Client) transfer(reqs []xfer.Request, notify [][]byte, timeout time.Duration, results []error, opts []CallOption) (Summary, error) {
	if len(results) != len(reqs) || len(reqs) == 0 {
		return Summary{}, fmt.Errorf("%w: %d results for %d requests", ErrInvalidArgument, len(results), len(reqs))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyTransferRequestBody, opts)
	c.req.Requests = append(c.req.Requests, reqs...)
	c.req.Notify = notify
	c.req.TimeoutMS = millis(timeout)
	if c.opts.CallTimeout > 0 && timeout > 0 {
		// Let the socket wait as long as the daemon may.
		defer func(d time.Duration) { c.opts.CallTimeout = d }(c.opts.CallTimeout)
		c.opts.CallTimeout += timeout
	}
	if err := c.roundTrip(tcproto.ResponseBodyTransferResponse, -1, nil); err != nil {
		return Summary{}, err
	}
	if err := c.positional(len(c.resp.Codes), len(reqs)); err != nil {
		return Summary{}, err
	}
	if err := c.positional(len(c.resp.States), len(reqs)); err != nil {
		return Summary{}, err
	}
	for i, code := range c.resp.Codes {
		results[i] = itemErr(code)
	}
	return c.resp.Summary, nil
}

// Stats returns the daemon's counters.
func (c *Client) Stats(opts ...CallOption) (Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyStatsRequest, opts)
	if err := c.roundTrip(tcproto.ResponseBodyStatsResponse, -1, nil); err != nil {
		return Stats{}, err
	}
	r := &c.resp
	return Stats{Pool: append(r.Pool[:0:0], r.Pool...), Engine: append(r.Engine[:0:0], r.Engine...),
		Connection: append(r.Conn[:0:0], r.Conn...), Transports: append(r.Transports[:0:0], r.Transports...),
		Connections: int(r.Connections)}, nil
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
