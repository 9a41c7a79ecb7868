package wire

import "github.com/tensorcast/tensorcast/fbs/tcproto"

// RegisterBufferRequest registers Size bytes of the memfd (or tmpfs file)
// that travels with it (SCM_RIGHTS) as a client buffer: sealed, sealable
// (the daemon seals it against shrinking) or unsealed (see shm/doc.go).
type RegisterBufferRequest struct{ Size uint64 }

func (*RegisterBufferRequest) Kind() RequestKind { return tcproto.RequestBodyRegisterBufferRequest }

func (m *RegisterBufferRequest) fields(f *fields) { scalar(f, 0, &m.Size) }

// RegisterBufferResponse names the registered buffer's segment.
type RegisterBufferResponse struct{ Segment uint64 }

func (*RegisterBufferResponse) Kind() ResponseKind { return tcproto.ResponseBodyRegisterBufferResponse }

func (m *RegisterBufferResponse) fields(f *fields) { scalar(f, 0, &m.Segment) }

// UnregisterBufferRequest unregisters a buffer or file segment.
type UnregisterBufferRequest struct{ Segment uint64 }

func (*UnregisterBufferRequest) Kind() RequestKind { return tcproto.RequestBodyUnregisterBufferRequest }

func (m *UnregisterBufferRequest) fields(f *fields) { scalar(f, 0, &m.Segment) }

// UnregisterBufferResponse says the segment is gone.
type UnregisterBufferResponse struct{ noFields }

func (*UnregisterBufferResponse) Kind() ResponseKind {
	return tcproto.ResponseBodyUnregisterBufferResponse
}

// RegisterFileRequest asks the daemon to open Path (O_DIRECT with Direct)
// as a file segment of Size bytes (0: the file's size).
type RegisterFileRequest struct {
	Path   []byte // required, at most DecodeLimits.MaxPath bytes
	Direct bool
	Size   uint64
}

func (*RegisterFileRequest) Kind() RequestKind { return tcproto.RequestBodyRegisterFileRequest }

func (m *RegisterFileRequest) fields(f *fields) {
	text(f, 0, &m.Path, f.lim.MaxPath)
	f.require(len(m.Path) > 0, "empty path")
	flag(f, 1, &m.Direct)
	scalar(f, 2, &m.Size)
}

// RegisterFileResponse names the file's segment and its size.
type RegisterFileResponse struct{ Segment, Size uint64 }

func (*RegisterFileResponse) Kind() ResponseKind { return tcproto.ResponseBodyRegisterFileResponse }

func (m *RegisterFileResponse) fields(f *fields) {
	scalar(f, 0, &m.Segment)
	scalar(f, 1, &m.Size)
}

// PoolInfoRequest asks for the daemon's pool; its memfd comes back with
// the answer (SCM_RIGHTS).
type PoolInfoRequest struct{ noFields }

func (*PoolInfoRequest) Kind() RequestKind { return tcproto.RequestBodyPoolInfoRequest }

// PoolInfoResponse describes the pool: its segment, size and block sizes
// (smallest first).
type PoolInfoResponse struct {
	Segment, Size uint64
	BlockClasses  []uint64
}

func (*PoolInfoResponse) Kind() ResponseKind { return tcproto.ResponseBodyPoolInfoResponse }

func (m *PoolInfoResponse) fields(f *fields) {
	scalar(f, 0, &m.Segment)
	scalar(f, 1, &m.Size)
	list(f, 2, &m.BlockClasses, f.lim.MaxCounters)
}

// AllocBlocksRequest allocates N pool blocks of Size bytes, all or nothing.
type AllocBlocksRequest struct {
	N    uint32 // at most DecodeLimits.MaxOffsets
	Size uint64
}

func (*AllocBlocksRequest) Kind() RequestKind { return tcproto.RequestBodyAllocBlocksRequest }

func (m *AllocBlocksRequest) fields(f *fields) {
	scalar(f, 0, &m.N)
	f.atMost(uint64(m.N), f.lim.MaxOffsets, "blocks")
	scalar(f, 1, &m.Size)
}

// AllocBlocksResponse holds the blocks' offsets in the pool, Offsets[i]
// the i-th block.
type AllocBlocksResponse struct{ Offsets []uint64 }

func (*AllocBlocksResponse) Kind() ResponseKind { return tcproto.ResponseBodyAllocBlocksResponse }

func (m *AllocBlocksResponse) fields(f *fields) { list(f, 0, &m.Offsets, f.lim.MaxOffsets) }

// FreeBlocksRequest frees pool blocks by offset.
type FreeBlocksRequest struct{ Offsets []uint64 }

func (*FreeBlocksRequest) Kind() RequestKind { return tcproto.RequestBodyFreeBlocksRequest }

func (m *FreeBlocksRequest) fields(f *fields) { list(f, 0, &m.Offsets, f.lim.MaxOffsets) }

// FreeBlocksResponse has one code per offset, positionally.
type FreeBlocksResponse struct{ Codes []Code }

func (*FreeBlocksResponse) Kind() ResponseKind { return tcproto.ResponseBodyFreeBlocksResponse }

func (m *FreeBlocksResponse) fields(f *fields) { list(f, 0, &m.Codes, f.lim.MaxOffsets) }
