package wire

import (
	"fmt"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// The KV block store's calls on the socket. Each batch call's keys are a
// key list (keys.go); its answer has one code per key, positionally, and
// the decoder refuses an argument vector that is not positional with the
// keys (ErrMalformed).

// Extent is where a copying store call's value lies or goes: Length bytes
// at Offset in Segment (a client buffer of the connection, or pool blocks
// it holds). It is the schema's StoreExtent struct.
type Extent struct {
	Segment xfer.SegmentID
	Offset  uint64
	Length  uint64
}

// StorePutRequest stores Keys[i] with a copy of the bytes at Values[i];
// with Durable the answer comes once each value is on L2.
type StorePutRequest struct {
	Keys    [][]byte
	Values  []Extent // positional with Keys
	Durable bool
}

func (*StorePutRequest) Kind() RequestKind { return tcproto.RequestBodyStorePutRequest }

func (m *StorePutRequest) fields(f *fields) {
	keyList(f, 0, &m.Keys)
	extents(f, 1, &m.Values, len(m.Keys))
	flag(f, 2, &m.Durable)
}

// StorePutResponse has one code per key.
type StorePutResponse struct{ Codes []Code }

func (*StorePutResponse) Kind() ResponseKind { return tcproto.ResponseBodyStorePutResponse }

func (m *StorePutResponse) fields(f *fields) { list(f, 0, &m.Codes, f.lim.MaxOffsets) }

// StoreReadRequest copies the value of Keys[i] into Dests[i].
type StoreReadRequest struct {
	Keys  [][]byte
	Dests []Extent // positional with Keys; each at least as long as its value
}

func (*StoreReadRequest) Kind() RequestKind { return tcproto.RequestBodyStoreReadRequest }

func (m *StoreReadRequest) fields(f *fields) {
	keyList(f, 0, &m.Keys)
	extents(f, 1, &m.Dests, len(m.Keys))
}

// StoreReadResponse has one code and one value length per key (the length
// is set for a destination too short as well).
type StoreReadResponse struct {
	Codes   []Code
	Lengths []uint64
}

func (*StoreReadResponse) Kind() ResponseKind { return tcproto.ResponseBodyStoreReadResponse }

func (m *StoreReadResponse) fields(f *fields) {
	list(f, 0, &m.Codes, f.lim.MaxOffsets)
	list(f, 1, &m.Lengths, f.lim.MaxOffsets)
}

// StoreRemoveRequest removes Keys; an absent key is OK.
type StoreRemoveRequest struct{ Keys [][]byte }

func (*StoreRemoveRequest) Kind() RequestKind { return tcproto.RequestBodyStoreRemoveRequest }

func (m *StoreRemoveRequest) fields(f *fields) { keyList(f, 0, &m.Keys) }

// StoreRemoveResponse has one code per key.
type StoreRemoveResponse struct{ Codes []Code }

func (*StoreRemoveResponse) Kind() ResponseKind { return tcproto.ResponseBodyStoreRemoveResponse }

func (m *StoreRemoveResponse) fields(f *fields) { list(f, 0, &m.Codes, f.lim.MaxOffsets) }

// StorePinRequest pins every key for the connection, or none; TTLMS > 0
// makes each pin a lease of that many milliseconds.
type StorePinRequest struct {
	Keys  [][]byte
	TTLMS uint32
}

func (*StorePinRequest) Kind() RequestKind { return tcproto.RequestBodyStorePinRequest }

func (m *StorePinRequest) fields(f *fields) {
	keyList(f, 0, &m.Keys)
	scalar(f, 1, &m.TTLMS)
}

// StorePinResponse has one code per key: all OK, or none applied.
type StorePinResponse struct{ Codes []Code }

func (*StorePinResponse) Kind() ResponseKind { return tcproto.ResponseBodyStorePinResponse }

func (m *StorePinResponse) fields(f *fields) { list(f, 0, &m.Codes, f.lim.MaxOffsets) }

// StoreUnpinRequest drops one pin of the connection from every key, or
// from none.
type StoreUnpinRequest struct{ Keys [][]byte }

func (*StoreUnpinRequest) Kind() RequestKind { return tcproto.RequestBodyStoreUnpinRequest }

func (m *StoreUnpinRequest) fields(f *fields) { keyList(f, 0, &m.Keys) }

// StoreUnpinResponse has one code per key: all OK, or none applied.
type StoreUnpinResponse struct{ Codes []Code }

func (*StoreUnpinResponse) Kind() ResponseKind { return tcproto.ResponseBodyStoreUnpinResponse }

func (m *StoreUnpinResponse) fields(f *fields) { list(f, 0, &m.Codes, f.lim.MaxOffsets) }

// StoreReserveRequest reserves a pool block of Sizes[i] bytes for Keys[i],
// to be written in place and committed.
type StoreReserveRequest struct {
	Keys  [][]byte
	Sizes []uint64 // positional with Keys
}

func (*StoreReserveRequest) Kind() RequestKind { return tcproto.RequestBodyStoreReserveRequest }

func (m *StoreReserveRequest) fields(f *fields) {
	keyList(f, 0, &m.Keys)
	list(f, 1, &m.Sizes, f.lim.MaxOffsets)
	if f.reading() && len(m.Sizes) != len(m.Keys) {
		f.fail(fmt.Errorf("%w: %d sizes for %d keys", ErrMalformed, len(m.Sizes), len(m.Keys)))
	}
}

// StoreReserveResponse has one code and one pool offset per key (0 where
// the code is not OK).
type StoreReserveResponse struct {
	Codes   []Code
	Offsets []uint64
}

func (*StoreReserveResponse) Kind() ResponseKind { return tcproto.ResponseBodyStoreReserveResponse }

func (m *StoreReserveResponse) fields(f *fields) {
	list(f, 0, &m.Codes, f.lim.MaxOffsets)
	list(f, 1, &m.Offsets, f.lim.MaxOffsets)
}

// StoreCommitRequest makes reserved keys visible; with Durable once each
// value is on L2.
type StoreCommitRequest struct {
	Keys    [][]byte
	Durable bool
}

func (*StoreCommitRequest) Kind() RequestKind { return tcproto.RequestBodyStoreCommitRequest }

func (m *StoreCommitRequest) fields(f *fields) {
	keyList(f, 0, &m.Keys)
	flag(f, 1, &m.Durable)
}

// StoreCommitResponse has one code per key.
type StoreCommitResponse struct{ Codes []Code }

func (*StoreCommitResponse) Kind() ResponseKind { return tcproto.ResponseBodyStoreCommitResponse }

func (m *StoreCommitResponse) fields(f *fields) { list(f, 0, &m.Codes, f.lim.MaxOffsets) }

// StoreAbortRequest gives back reservations of the connection without
// committing them, each key on its own.
type StoreAbortRequest struct{ Keys [][]byte }

func (*StoreAbortRequest) Kind() RequestKind { return tcproto.RequestBodyStoreAbortRequest }

func (m *StoreAbortRequest) fields(f *fields) { keyList(f, 0, &m.Keys) }

// StoreAbortResponse has one code per key.
type StoreAbortResponse struct{ Codes []Code }

func (*StoreAbortResponse) Kind() ResponseKind { return tcproto.ResponseBodyStoreAbortResponse }

func (m *StoreAbortResponse) fields(f *fields) { list(f, 0, &m.Codes, f.lim.MaxOffsets) }

// StoreStatRequest describes one key.
type StoreStatRequest struct{ Key []byte }

func (*StoreStatRequest) Kind() RequestKind { return tcproto.RequestBodyStoreStatRequest }

func (m *StoreStatRequest) fields(f *fields) { blob(f, 0, &m.Key, MaxPackedKey) }

// StoreKeyInfo is one stored key as an operator sees it: its value's size,
// the tiers it is on, its pins (over all connections), and whether it is
// owed a writeback (Dirty) or its writeback gave up (Tombstone). Key is
// set in listings only; it aliases the frame when decoded.
type StoreKeyInfo struct {
	Key              []byte
	Size             uint64
	InL1, InL2       bool
	Pins             uint32
	Dirty, Tombstone bool
}

func (m *StoreKeyInfo) fields(f *fields) {
	blob(f, 0, &m.Key, MaxPackedKey)
	m.info(f, 1)
}

// info is the fields after the key, from slot first on; StoreStatResponse
// has them from slot 0.
func (m *StoreKeyInfo) info(f *fields, first int) {
	scalar(f, first, &m.Size)
	flag(f, first+1, &m.InL1)
	flag(f, first+2, &m.InL2)
	scalar(f, first+3, &m.Pins)
	flag(f, first+4, &m.Dirty)
	flag(f, first+5, &m.Tombstone)
}

// StoreStatResponse describes the key (its Key field is left empty).
type StoreStatResponse struct{ Info StoreKeyInfo }

func (*StoreStatResponse) Kind() ResponseKind { return tcproto.ResponseBodyStoreStatResponse }

func (m *StoreStatResponse) fields(f *fields) {
	if f.pass == decoding {
		m.Info.Key = nil
	}
	m.Info.info(f, 0)
}

// StoreListRequest lists up to Max keys that start with Prefix and sort
// after After.
type StoreListRequest struct {
	Prefix []byte
	After  []byte
	Max    uint32
}

func (*StoreListRequest) Kind() RequestKind { return tcproto.RequestBodyStoreListRequest }

func (m *StoreListRequest) fields(f *fields) {
	blob(f, 0, &m.Prefix, MaxPackedKey)
	blob(f, 1, &m.After, MaxPackedKey)
	scalar(f, 2, &m.Max)
}

// StoreListResponse is the keys in order; More says the listing goes on
// after the last one.
type StoreListResponse struct {
	Keys []StoreKeyInfo
	More bool
}

func (*StoreListResponse) Kind() ResponseKind { return tcproto.ResponseBodyStoreListResponse }

func (m *StoreListResponse) fields(f *fields) {
	tables(f, 0, &m.Keys, f.lim.MaxItems)
	flag(f, 1, &m.More)
}

// StoreFlushRequest waits, at most TimeoutMS, until no value is owed a
// writeback to L2.
type StoreFlushRequest struct{ TimeoutMS uint32 }

func (*StoreFlushRequest) Kind() RequestKind { return tcproto.RequestBodyStoreFlushRequest }

func (m *StoreFlushRequest) fields(f *fields) { scalar(f, 0, &m.TimeoutMS) }

// StoreFlushResponse says nothing is owed a writeback any more.
type StoreFlushResponse struct{ noFields }

func (*StoreFlushResponse) Kind() ResponseKind { return tcproto.ResponseBodyStoreFlushResponse }

// keyList is a store call's keys: a packed key list in a [ubyte] field,
// decoded into *v (aliasing the frame) with at most lim.MaxOffsets keys;
// written even when empty.
func keyList(f *fields, slot int, v *[][]byte) {
	switch f.pass {
	case decoding:
		if f.err != nil {
			return
		}
		packed, err := bytesField(&f.tab, vtableOffset(slot), f.lim.MaxOffsets*(KeyHeader+MaxStoreKey))
		if err != nil {
			*v = (*v)[:0]
			f.fail(err)
			return
		}
		*v, err = SplitKeys(packed, *v, f.lim.MaxOffsets)
		f.fail(err)
	case creating:
		total := 0
		for _, k := range *v {
			total += KeyHeader + min(len(k), MaxPackedKey)
		}
		f.b.StartVector(1, total, 1)
		for i := len(*v) - 1; i >= 0; i-- {
			k := (*v)[i]
			k = k[:min(len(k), MaxPackedKey)] // longer keys are the client's to refuse
			for j := len(k) - 1; j >= 0; j-- {
				f.b.PlaceByte(k[j])
			}
			f.b.PlaceByte(byte(len(k) >> 8))
			f.b.PlaceByte(byte(len(k)))
		}
		f.created(slot, f.b.EndVector(total))
	case adding:
		f.addChild(slot)
	}
}

// storeExtentSize is the wire size of one StoreExtent struct.
const storeExtentSize = 24

// extents is a vector of StoreExtent structs positional with n keys,
// decoded into *v's storage; written even when empty.
func extents(f *fields, slot int, v *[]Extent, n int) {
	switch f.pass {
	case decoding:
		if f.err != nil {
			return
		}
		k, start, err := vecAt(&f.tab, vtableOffset(slot), storeExtentSize, f.lim.MaxOffsets)
		*v = (*v)[:0]
		var e tcproto.StoreExtent
		for i := 0; err == nil && i < k; i++ {
			e.Init(f.tab.Bytes, start+flatbuffers.UOffsetT(i*storeExtentSize))
			*v = append(*v, Extent{Segment: xfer.SegmentID(e.Segment()), Offset: e.Offset(), Length: e.Length()})
		}
		f.fail(err)
		if f.reading() && len(*v) != n {
			f.fail(fmt.Errorf("%w: %d extents for %d keys", ErrMalformed, len(*v), n))
		}
	case creating:
		f.b.StartVector(storeExtentSize, len(*v), 8)
		for i := len(*v) - 1; i >= 0; i-- {
			e := &(*v)[i]
			tcproto.CreateStoreExtent(f.b, uint64(e.Segment), e.Offset, e.Length)
		}
		f.created(slot, f.b.EndVector(len(*v)))
	case adding:
		f.addChild(slot)
	}
}
