package queue

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// Ops of an SQE.
const (
	OpRead  uint8 = 1 // target → local
	OpWrite uint8 = 2 // local → target
	// OpNop completes at once with OK; a client uses it to measure the
	// queue itself.
	OpNop uint8 = 3
)

// SQE flags.
const (
	// SQEFlagNotify: the WRITE carries a notification, NotifyLen bytes at
	// NotifyOff in the data area.
	SQEFlagNotify uint8 = 1 << 0

	sqeFlagsKnown = SQEFlagNotify
)

// SQE is one submission entry as both sides see it in Go. Its wire form is
// 64 bytes (see the package doc).
type SQE struct {
	Op        uint8
	Flags     uint8
	TimeoutUS uint32 // 0: the queue's default
	UserData  uint64
	Local     uint64 // segment id
	LocalOff  uint64
	Target    uint64 // segment id
	TargetOff uint64
	Length    uint64
	NotifyOff uint32
	NotifyLen uint32
}

// CQE is one completion entry. Its wire form is 32 bytes.
type CQE struct {
	UserData uint64
	Result   uint64 // bytes moved
	Code     uint32 // the control protocol's status code; 0 is OK
	State    uint8  // the task's terminal state (xfer.State), 0 when it never ran
}

// put writes e at b[:SQESize] (the client's side: plain stores, published
// by the tail's atomic store).
func (e *SQE) put(b []byte) {
	_ = b[SQESize-1]
	le := binary.LittleEndian
	b[0], b[1], b[2], b[3] = e.Op, e.Flags, 0, 0
	le.PutUint32(b[4:], e.TimeoutUS)
	le.PutUint64(b[8:], e.UserData)
	le.PutUint64(b[16:], e.Local)
	le.PutUint64(b[24:], e.LocalOff)
	le.PutUint64(b[32:], e.Target)
	le.PutUint64(b[40:], e.TargetOff)
	le.PutUint64(b[48:], e.Length)
	le.PutUint32(b[56:], e.NotifyOff)
	le.PutUint32(b[60:], e.NotifyLen)
}

// copySQE copies the 64-byte entry at b into raw with atomic loads: the
// client may be rewriting it at this very moment, and what the daemon
// validates must be what it then uses. b is 8-aligned (entries are 64-byte
// aligned in a page-aligned mapping).
func copySQE(raw *[SQESize]byte, b []byte) {
	_ = b[SQESize-1]
	for i := 0; i < SQESize; i += 8 {
		v := (*atomic.Uint64)(unsafe.Pointer(&b[i])).Load()
		binary.LittleEndian.PutUint64(raw[i:], v)
	}
}

// DecodeSQE decodes a copied entry. It accepts any bytes; what the fields
// mean is checked by the daemon afterwards.
func DecodeSQE(raw *[SQESize]byte, e *SQE) {
	le := binary.LittleEndian
	e.Op, e.Flags = raw[0], raw[1]
	e.TimeoutUS = le.Uint32(raw[4:])
	e.UserData = le.Uint64(raw[8:])
	e.Local = le.Uint64(raw[16:])
	e.LocalOff = le.Uint64(raw[24:])
	e.Target = le.Uint64(raw[32:])
	e.TargetOff = le.Uint64(raw[40:])
	e.Length = le.Uint64(raw[48:])
	e.NotifyOff = le.Uint32(raw[56:])
	e.NotifyLen = le.Uint32(raw[60:])
}

// put writes c at b[:CQESize] (the daemon's side).
func (c *CQE) put(b []byte) {
	_ = b[CQESize-1]
	le := binary.LittleEndian
	le.PutUint64(b[0:], c.UserData)
	le.PutUint64(b[8:], c.Result)
	le.PutUint32(b[16:], c.Code)
	b[20] = c.State
	clear(b[21:CQESize])
}

// get reads the entry at b (the client's side, after the tail's atomic
// load).
func (c *CQE) get(b []byte) {
	_ = b[CQESize-1]
	le := binary.LittleEndian
	c.UserData = le.Uint64(b[0:])
	c.Result = le.Uint64(b[8:])
	c.Code = le.Uint32(b[16:])
	c.State = b[20]
}
