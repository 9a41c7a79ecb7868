package queue

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// Fixed values of the layout (see the package doc).
const (
	Magic   = 0x31514354 // "TCQ1" little-endian
	Version = 1

	SQESize = 64
	CQESize = 32

	headerSize = 4096

	offMagic     = 0x000
	offVersion   = 0x004
	offSQEntries = 0x008
	offCQEntries = 0x00c
	offSQESize   = 0x010
	offCQESize   = 0x014
	offSQOff     = 0x018
	offCQOff     = 0x01c
	offDataOff   = 0x020
	offDataSize  = 0x024
	offSize      = 0x028
	offID        = 0x030
	offDoorbell  = 0x038
	offBellAck   = 0x03c
	offSQHead    = 0x040
	offSQTail    = 0x080
	offSQFlags   = 0x0c0
	offSQWake    = 0x0c4
	offCQHead    = 0x100
	offCQTail    = 0x140
	offCQFlags   = 0x180
	offCQWake    = 0x184
	offCQTarget  = 0x188
	offState     = 0x1c0
	offViolation = 0x1c4
)

// Flags in sq_flags (set by the daemon) and cq_flags (set by the client).
const (
	// FlagNeedWakeup: the daemon sleeps until the client submits.
	FlagNeedWakeup uint32 = 1 << 0
	// FlagCQWait: the daemon sleeps until the client reaps (the completion
	// ring has no room for another request in flight).
	FlagCQWait uint32 = 1 << 1
	// FlagWaiting (cq_flags): the client sleeps until a completion comes.
	FlagWaiting uint32 = 1 << 0
	// FlagWaitTarget (cq_flags, with FlagWaiting): the client sleeps until
	// cq_tail reaches cq_target, not for every completion. A client that
	// sets only FlagWaiting is woken by each one.
	FlagWaitTarget uint32 = 1 << 1
)

// Doorbells: what a client does to wake a daemon sleeping for it, as the
// header's doorbell word (written by the daemon) says.
const (
	// DoorbellFutex: FUTEX_WAKE on sq_wake.
	DoorbellFutex uint32 = 0
	// DoorbellEventfd: write 1 (8 bytes) to the eventfd passed as the
	// second descriptor with OpenQueue's answer. A client that does so
	// sets bell_ack to BellAckEventfd.
	DoorbellEventfd uint32 = 1
	// BellAckEventfd in bell_ack: this client rings the eventfd.
	BellAckEventfd uint32 = 1
)

// Bits of the state word, written by the daemon.
const (
	// StateClosed: the daemon closed the queue; nothing more is taken and
	// every request in flight has ended or will end with a CQE.
	StateClosed uint32 = 1 << 0
	// StateBroken: the client wrote an index the daemon refused; the
	// daemon takes no more entries from this queue.
	StateBroken uint32 = 1 << 1
)

// Limits on a queue's geometry.
const (
	MinEntries      = 2
	MaxSQEntries    = 1 << 15
	MaxCQEntries    = 1 << 16
	DefaultSQ       = 1024
	MaxDataSize     = 64 << 20
	DefaultDataSize = 256 << 10
)

// Geometry is a queue's sizes and where each part lives in the mapping.
type Geometry struct {
	SQEntries, CQEntries uint32
	DataSize             uint32
	SQOff, CQOff         uint32
	DataOff              uint32
	Size                 uint64
}

// NewGeometry checks and completes the sizes a client asked for:
// sqEntries rounded up to a power of two (0: DefaultSQ), cqEntries at least
// twice that (0: twice), dataSize rounded up to a page (0: DefaultDataSize).
func NewGeometry(sqEntries, cqEntries, dataSize uint32) (Geometry, error) {
	if sqEntries == 0 {
		sqEntries = DefaultSQ
	}
	if sqEntries < MinEntries || sqEntries > MaxSQEntries {
		return Geometry{}, fmt.Errorf("%w: %d submission entries (want %d..%d)", ErrGeometry, sqEntries, MinEntries, MaxSQEntries)
	}
	sqEntries = pow2(sqEntries)
	if cqEntries == 0 {
		cqEntries = 2 * sqEntries
	}
	if cqEntries < 2*sqEntries || cqEntries > MaxCQEntries {
		return Geometry{}, fmt.Errorf("%w: %d completion entries (want %d..%d)", ErrGeometry, cqEntries, 2*sqEntries, MaxCQEntries)
	}
	cqEntries = pow2(cqEntries)
	if dataSize == 0 {
		dataSize = DefaultDataSize
	}
	if dataSize > MaxDataSize {
		return Geometry{}, fmt.Errorf("%w: data area of %d bytes (max %d)", ErrGeometry, dataSize, MaxDataSize)
	}
	dataSize = (dataSize + 4095) &^ 4095
	g := Geometry{SQEntries: sqEntries, CQEntries: cqEntries, DataSize: dataSize, SQOff: headerSize}
	g.CQOff = g.SQOff + sqEntries*SQESize
	g.DataOff = g.CQOff + cqEntries*CQESize
	g.DataOff = (g.DataOff + 4095) &^ 4095
	g.Size = uint64(g.DataOff) + uint64(dataSize)
	return g, nil
}

// pow2 rounds n (>= 1) up to a power of two.
func pow2(n uint32) uint32 {
	if n&(n-1) == 0 {
		return n
	}
	return 1 << bits.Len32(n)
}

// writeHeader fills the header of a new queue's mapping.
func (g Geometry) writeHeader(mem []byte, id uint64) {
	le := binary.LittleEndian
	le.PutUint32(mem[offMagic:], Magic)
	le.PutUint32(mem[offVersion:], Version)
	le.PutUint32(mem[offSQEntries:], g.SQEntries)
	le.PutUint32(mem[offCQEntries:], g.CQEntries)
	le.PutUint32(mem[offSQESize:], SQESize)
	le.PutUint32(mem[offCQESize:], CQESize)
	le.PutUint32(mem[offSQOff:], g.SQOff)
	le.PutUint32(mem[offCQOff:], g.CQOff)
	le.PutUint32(mem[offDataOff:], g.DataOff)
	le.PutUint32(mem[offDataSize:], g.DataSize)
	le.PutUint64(mem[offSize:], g.Size)
	le.PutUint64(mem[offID:], id)
}

// readHeader reads the geometry a mapping's header declares and checks it
// is one NewGeometry makes and that it fits size bytes.
func readHeader(mem []byte) (Geometry, uint64, error) {
	if len(mem) < headerSize {
		return Geometry{}, 0, fmt.Errorf("%w: mapping of %d bytes", ErrGeometry, len(mem))
	}
	le := binary.LittleEndian
	if m, v := le.Uint32(mem[offMagic:]), le.Uint32(mem[offVersion:]); m != Magic || v != Version {
		return Geometry{}, 0, fmt.Errorf("%w: magic %#x version %d (want %#x version %d)", ErrGeometry, m, v, Magic, Version)
	}
	if s, c := le.Uint32(mem[offSQESize:]), le.Uint32(mem[offCQESize:]); s != SQESize || c != CQESize {
		return Geometry{}, 0, fmt.Errorf("%w: entry sizes %d/%d", ErrGeometry, s, c)
	}
	want, err := NewGeometry(le.Uint32(mem[offSQEntries:]), le.Uint32(mem[offCQEntries:]), le.Uint32(mem[offDataSize:]))
	if err != nil {
		return Geometry{}, 0, err
	}
	got := Geometry{SQEntries: le.Uint32(mem[offSQEntries:]), CQEntries: le.Uint32(mem[offCQEntries:]),
		DataSize: le.Uint32(mem[offDataSize:]), SQOff: le.Uint32(mem[offSQOff:]), CQOff: le.Uint32(mem[offCQOff:]),
		DataOff: le.Uint32(mem[offDataOff:]), Size: le.Uint64(mem[offSize:])}
	if got != want || got.Size > uint64(len(mem)) {
		return Geometry{}, 0, fmt.Errorf("%w: header %+v does not match its sizes (%+v) or the %d-byte mapping", ErrGeometry, got, want, len(mem))
	}
	return got, le.Uint64(mem[offID:]), nil
}

// word is the shared u32 at off, for atomic access. The mapping is page
// aligned and every word offset is a multiple of 4.
func word(mem []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

// words are the shared control words of one mapping.
type words struct {
	sqHead, sqTail, sqFlags, sqWake *atomic.Uint32
	cqHead, cqTail, cqFlags, cqWake *atomic.Uint32
	cqTarget                        *atomic.Uint32
	state, violations               *atomic.Uint32
	doorbell, bellAck               *atomic.Uint32
}

func wordsOf(mem []byte) words {
	return words{
		sqHead: word(mem, offSQHead), sqTail: word(mem, offSQTail), sqFlags: word(mem, offSQFlags), sqWake: word(mem, offSQWake),
		cqHead: word(mem, offCQHead), cqTail: word(mem, offCQTail), cqFlags: word(mem, offCQFlags), cqWake: word(mem, offCQWake),
		cqTarget: word(mem, offCQTarget),
		state:    word(mem, offState), violations: word(mem, offViolation),
		doorbell: word(mem, offDoorbell), bellAck: word(mem, offBellAck),
	}
}

// wake clears bit in flags and, if it was set, bumps the futex word and
// wakes whoever sleeps on it. It reports whether it made the system call.
func wake(flags *atomic.Uint32, bit uint32, w *atomic.Uint32) bool {
	if flags.Load()&bit == 0 {
		return false
	}
	if flags.And(^bit)&bit == 0 {
		return false // another waker cleared it first
	}
	w.Add(1)
	futexWake(w)
	return true
}
