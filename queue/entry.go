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

// Store ops: calls of the KV block store with their keys in the data area
// and their per-key results in a client buffer (see the package doc, "Store
// calls"). Every op from OpStoreFirst on is the store's.
const (
	OpStoreFirst uint8 = 16
	// OpStoreGet pins each key for the connection and returns where its
	// value lies in the pool (promoting a value only on L2 first).
	OpStoreGet uint8 = 16
	// OpStoreReserve reserves a pool block of Length bytes for each key,
	// to be written in place and committed.
	OpStoreReserve uint8 = 17
	// OpStoreCommit makes reserved keys visible; with SQEFlagDurable once
	// each value is on L2.
	OpStoreCommit uint8 = 18
	// OpStoreExists says which keys are stored; it renews nothing.
	OpStoreExists uint8 = 19
	// OpStoreLookupPrefix counts the leading keys that are stored; with
	// SQEFlagPin it pins them for the connection in the same call. It has
	// no results region: the CQE's result is the count.
	OpStoreLookupPrefix uint8 = 20
	// OpStoreUnpin drops one pin of the connection from every key, or from
	// none: the release of a Get or a pinned LookupPrefix.
	OpStoreUnpin uint8 = 21
	OpStoreLast  uint8 = 21
)

// SQE flags.
const (
	// SQEFlagNotify: the WRITE carries a notification, NotifyLen bytes at
	// NotifyOff in the data area.
	SQEFlagNotify uint8 = 1 << 0

	// SQEFlagDurable: an OpStoreCommit completes once each value is on L2.
	SQEFlagDurable uint8 = 1 << 1
	// SQEFlagPin: an OpStoreLookupPrefix pins the prefix it found.
	SQEFlagPin uint8 = 1 << 2
)

// StoreResultSize is the size of one key's record in a store op's results
// region (see the package doc).
const StoreResultSize = 16

// StoreUnwritten is the code a client writes into every record before it
// submits a store op: a record that still holds it after the completion was
// never written, a short answer.
const StoreUnwritten uint8 = 0xff

// PutStoreResult writes one key's record at b[:StoreResultSize]: its code,
// and for OpStoreGet and OpStoreReserve the value's length and offset in
// the pool.
func PutStoreResult(b []byte, code uint8, length uint32, offset uint64) {
	_ = b[StoreResultSize-1]
	b[0], b[1], b[2], b[3] = code, 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:], length)
	binary.LittleEndian.PutUint64(b[8:], offset)
}

// StoreResult reads one key's record at b[:StoreResultSize]; ok is false
// when its reserved bytes are not zero (not a record the daemon wrote).
func StoreResult(b []byte) (code uint8, length uint32, offset uint64, ok bool) {
	_ = b[StoreResultSize-1]
	le := binary.LittleEndian
	return b[0], le.Uint32(b[4:]), le.Uint64(b[8:]), b[1]|b[2]|b[3] == 0
}

// SQE is one submission entry as both sides see it in Go. Its wire form is
// 64 bytes (see the package doc).
type SQE struct {
	Op        uint8
	Flags     uint8
	Count     uint16 // store ops: the number of keys
	TimeoutUS uint32 // 0: the queue's default
	UserData  uint64
	Local     uint64 // segment id
	LocalOff  uint64
	Target    uint64 // segment id
	TargetOff uint64
	Length    uint64
	// NotifyOff and NotifyLen are a range of the data area: a WRITE's
	// notification (SQEFlagNotify), a store op's key list.
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
	b[0], b[1] = e.Op, e.Flags
	le.PutUint16(b[2:], e.Count)
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
	e.Count = le.Uint16(raw[2:])
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
