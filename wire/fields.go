package wire

import (
	"fmt"
	"unsafe"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// A message is encoded and decoded from one description: its fields
// method, which names each field once, with its slot (its index in the
// schema table) and, for decoding, its limit. A visit of the fields method
// makes one pass:
//
//   - decoding reads each field from the table and checks it;
//   - creating builds each field's strings, vectors and nested tables,
//     which flatbuffers wants before the table that points to them;
//   - adding adds each field to the table being built.
//
// So a message's encoding and decoding cannot disagree, and a message is its
// struct, its Kind and its field list.
type pass uint8

const (
	decoding pass = iota
	creating
	adding
)

// table is a schema table: a message body or an element of one.
type table interface{ fields(f *fields) }

// noFields is the field list of a table without fields; such a message
// embeds it.
type noFields struct{}

func (noFields) fields(*fields) {}

const (
	maxDepth = 4  // tables nested: a frame, its body, the body's elements
	maxSlots = 16 // fields of the widest table (a union takes two)
)

// fields is the state of a pass over a table's fields. Each Request and
// Response keeps one, so passes allocate nothing.
type fields struct {
	pass pass

	// decoding: the table read, the limits, the first error (the fields
	// after it are not read).
	tab flatbuffers.Table
	lim DecodeLimits
	err error

	// creating and adding: the builder and, per nesting depth, the
	// table's field count and the children created for its slots.
	b     *flatbuffers.Builder
	depth int
	n     [maxDepth]int
	child [maxDepth][maxSlots]flatbuffers.UOffsetT
	elems [maxDepth][]flatbuffers.UOffsetT // scratch: a vector's element tables
}

// decode reads t's fields from tab, checked against lim.
func (f *fields) decode(t table, tab flatbuffers.Table, lim DecodeLimits) error {
	f.pass, f.tab, f.lim, f.err = decoding, tab, lim, nil
	t.fields(f)
	return f.err
}

// encode builds t in b and returns the table's offset.
func (f *fields) encode(t table, b *flatbuffers.Builder) flatbuffers.UOffsetT {
	f.b, f.depth = b, 0
	return f.build(t)
}

// build builds t's children, then t, and returns its offset. A nested
// table is built during its parent's creating pass, which goes on after.
func (f *fields) build(t table) flatbuffers.UOffsetT {
	if f.depth+1 >= maxDepth {
		panic("wire: tables nested too deep")
	}
	f.depth++
	d := f.depth
	f.n[d] = 0
	f.pass = creating
	t.fields(f)
	f.b.StartObject(f.n[d])
	f.pass = adding
	t.fields(f)
	off := f.b.EndObject()
	f.depth--
	f.pass = creating
	return off
}

// reading reports whether this is a decoding pass that has not failed yet.
func (f *fields) reading() bool { return f.pass == decoding && f.err == nil }

// at is the position of the field in slot of the table read, 0 when absent.
func (f *fields) at(slot int) flatbuffers.UOffsetT {
	o := flatbuffers.UOffsetT(f.tab.Offset(vtableOffset(slot)))
	if o == 0 {
		return 0
	}
	return o + f.tab.Pos
}

func vtableOffset(slot int) flatbuffers.VOffsetT { return flatbuffers.VOffsetT(4 + 2*slot) }

// created records, in a creating pass, the table's field in slot and the
// child built for it (0 for none, or for a scalar).
func (f *fields) created(slot int, child flatbuffers.UOffsetT) {
	d := f.depth
	f.n[d] = max(f.n[d], slot+1)
	f.child[d][slot] = child
}

// addChild adds, in an adding pass, the child created for slot.
func (f *fields) addChild(slot int) {
	if c := f.child[f.depth][slot]; c != 0 {
		f.b.PrependUOffsetTSlot(slot, c, 0)
	}
}

// fail records a decoding error.
func (f *fields) fail(err error) {
	if f.err == nil {
		f.err = err
	}
}

// require fails the decoding with ErrMalformed unless ok.
func (f *fields) require(ok bool, what string) {
	if f.reading() && !ok {
		f.fail(fmt.Errorf("%w: %s", ErrMalformed, what))
	}
}

// atMost fails the decoding with ErrLimit when n exceeds limit.
func (f *fields) atMost(n uint64, limit int, what string) {
	if f.reading() && n > uint64(limit) {
		f.fail(fmt.Errorf("%w: %d %s (limit %d)", ErrLimit, n, what, limit))
	}
}

// unsigned is what a scalar field holds: an unsigned integer or an enum.
type unsigned interface {
	~uint8 | ~uint16 | ~uint32 | ~uint64
}

// scalar is an unsigned integer or enum field, as wide as T; zero is the
// default, which is not written.
func scalar[T unsigned](f *fields, slot int, v *T) {
	width := int(unsafe.Sizeof(*v))
	switch f.pass {
	case decoding:
		if f.err == nil {
			*v = 0
			if o := f.at(slot); o != 0 {
				*v = T(le(f.tab.Bytes[o:], width))
			}
		}
	case creating:
		f.created(slot, 0)
	case adding:
		if *v != 0 {
			prependLE(f.b, uint64(*v), width)
			f.b.Slot(slot)
		}
	}
}

// flag is a bool field.
func flag(f *fields, slot int, v *bool) {
	var x uint8
	if *v {
		x = 1
	}
	scalar(f, slot, &x)
	if f.pass == decoding {
		*v = x != 0
	}
}

// le reads the width-byte little-endian unsigned integer at the start of b.
func le(b []byte, width int) uint64 {
	_ = b[width-1]
	var x uint64
	for i := width - 1; i >= 0; i-- {
		x = x<<8 | uint64(b[i])
	}
	return x
}

// prependLE prepends x as width little-endian bytes, aligned to width.
func prependLE(b *flatbuffers.Builder, x uint64, width int) {
	b.Prep(width, 0)
	for i := width - 1; i >= 0; i-- {
		b.PlaceByte(byte(x >> (8 * i)))
	}
}

// text is a string field of at most limit bytes, written even when empty.
// A []byte aliases the frame when decoded, a string is a copy.
func text[T []byte | string](f *fields, slot int, v *T, limit int) { textField(f, slot, v, limit, str) }

// optText is text that is left out when empty.
func optText[T []byte | string](f *fields, slot int, v *T, limit int) {
	textField(f, slot, v, limit, optStr)
}

// blob is a [ubyte] field of at most limit bytes, written even when empty,
// aliasing the frame when decoded.
func blob(f *fields, slot int, v *[]byte, limit int) { textField(f, slot, v, limit, ubytes) }

// textKind is how textField writes its field.
type textKind uint8

const (
	str    textKind = iota // a string, even when empty
	optStr                 // a string, left out when empty
	ubytes                 // a [ubyte] vector, even when empty
)

func textField[T []byte | string](f *fields, slot int, v *T, limit int, kind textKind) {
	switch f.pass {
	case decoding:
		if f.err == nil {
			b, err := bytesField(&f.tab, vtableOffset(slot), limit)
			*v = T(b)
			f.fail(err)
		}
	case creating:
		var c flatbuffers.UOffsetT
		switch s := any(v).(type) {
		case *string:
			if kind != optStr || *s != "" {
				c = f.b.CreateString(*s)
			}
		case *[]byte:
			switch {
			case kind == ubytes:
				c = f.b.CreateByteVector(*s)
			case kind == str || len(*s) > 0:
				c = f.b.CreateByteString(*s)
			}
		}
		f.created(slot, c)
	case adding:
		f.addChild(slot)
	}
}

// name is a required segment name: "segment" or "peer/segment", at most
// MaxName bytes.
func name(f *fields, slot int, v *[]byte) {
	text(f, slot, v, min(MaxName, f.lim.MaxPath))
	f.require(len(*v) > 0, "empty name")
}

// list is a vector of scalars (ulong offsets, ubyte codes and states) of at
// most limit elements, decoded into *v's storage; written even when empty.
func list[T unsigned](f *fields, slot int, v *[]T, limit int) {
	var zero T
	width := int(unsafe.Sizeof(zero))
	switch f.pass {
	case decoding:
		if f.err == nil {
			n, start, err := vecAt(&f.tab, vtableOffset(slot), width, limit)
			*v = (*v)[:0]
			for i := 0; err == nil && i < n; i++ {
				*v = append(*v, T(le(f.tab.Bytes[start+flatbuffers.UOffsetT(i*width):], width)))
			}
			f.fail(err)
		}
	case creating:
		f.b.StartVector(width, len(*v), width)
		for i := len(*v) - 1; i >= 0; i-- {
			prependLE(f.b, uint64((*v)[i]), width)
		}
		f.created(slot, f.b.EndVector(len(*v)))
	case adding:
		f.addChild(slot)
	}
}

// nested is a table field, always written; absent when decoded, *v is
// zero.
func nested[T any, P interface {
	*T
	table
}](f *fields, slot int, v *T) {
	switch f.pass {
	case decoding:
		if f.err != nil {
			return
		}
		o := f.at(slot)
		if o == 0 {
			var zero T
			*v = zero
			return
		}
		outer := f.tab
		f.tab = flatbuffers.Table{Bytes: outer.Bytes, Pos: outer.Indirect(o)}
		P(v).fields(f)
		f.tab = outer
	case creating:
		f.created(slot, f.build(P(v)))
	case adding:
		f.addChild(slot)
	}
}

// tables is a vector of tables of at most limit elements, decoded into *v's
// storage; written even when empty.
func tables[T any, P interface {
	*T
	table
}](f *fields, slot int, v *[]T, limit int) {
	tableList[T, P](f, slot, v, limit, false)
}

// optTables is tables that is left out when empty.
func optTables[T any, P interface {
	*T
	table
}](f *fields, slot int, v *[]T, limit int) {
	tableList[T, P](f, slot, v, limit, true)
}

func tableList[T any, P interface {
	*T
	table
}](f *fields, slot int, v *[]T, limit int, omitEmpty bool) {
	switch f.pass {
	case decoding:
		if f.err != nil {
			return
		}
		*v = (*v)[:0]
		outer := f.tab
		var zero T
		offsetsAt(f, slot, limit, func(i int, pos flatbuffers.UOffsetT) error {
			f.tab = flatbuffers.Table{Bytes: outer.Bytes, Pos: pos + flatbuffers.GetUOffsetT(outer.Bytes[pos:])}
			*v = append(*v, zero)
			P(&(*v)[i]).fields(f)
			return f.err
		})
		f.tab = outer
	case creating:
		createOffsets(f, slot, len(*v), omitEmpty, func(i int) flatbuffers.UOffsetT { return f.build(P(&(*v)[i])) })
	case adding:
		f.addChild(slot)
	}
}

// offsetVector encodes a vector of tables from their offsets.
func offsetVector(b *flatbuffers.Builder, offs []flatbuffers.UOffsetT) flatbuffers.UOffsetT {
	b.StartVector(4, len(offs), 4)
	for i := len(offs) - 1; i >= 0; i-- {
		b.PrependUOffsetT(offs[i])
	}
	return b.EndVector(len(offs))
}

// offsetsAt decodes the vector of at most limit offsets (to tables or
// strings) in slot: elem gets each element's index and the position of its
// offset, in order, until one fails; the first error fails f.
func offsetsAt(f *fields, slot, limit int, elem func(i int, pos flatbuffers.UOffsetT) error) {
	n, start, err := vecAt(&f.tab, vtableOffset(slot), 4, limit)
	for i := 0; err == nil && i < n; i++ {
		err = elem(i, start+flatbuffers.UOffsetT(i*4))
	}
	f.fail(err)
}

// createOffsets creates the vector of n tables or strings that elem
// creates (elem(i) for each, in order) and records it for slot; with
// omitEmpty, an empty one is left out.
func createOffsets(f *fields, slot, n int, omitEmpty bool, elem func(i int) flatbuffers.UOffsetT) {
	if n == 0 && omitEmpty {
		f.created(slot, 0)
		return
	}
	d := f.depth
	f.elems[d] = f.elems[d][:0]
	for i := 0; i < n; i++ {
		f.elems[d] = append(f.elems[d], elem(i))
	}
	f.created(slot, offsetVector(f.b, f.elems[d]))
}

// texts is a vector of at most limit strings, each at most size bytes,
// decoded as copies into *v's storage; left out when empty.
func texts(f *fields, slot int, v *[]string, limit, size int) {
	switch f.pass {
	case decoding:
		if f.err != nil {
			return
		}
		*v = (*v)[:0]
		offsetsAt(f, slot, limit, func(_ int, pos flatbuffers.UOffsetT) error {
			s, err := stringAt(f.tab.Bytes, pos, size)
			*v = append(*v, string(s))
			return err
		})
	case creating:
		createOffsets(f, slot, len(*v), true, func(i int) flatbuffers.UOffsetT { return f.b.CreateString((*v)[i]) })
	case adding:
		f.addChild(slot)
	}
}

// stringAt reads the string that the offset at pos (inside buf, checked by
// the vector's read) points to, checked against buf and limit.
func stringAt(buf []byte, pos flatbuffers.UOffsetT, limit int) ([]byte, error) {
	at := uint64(pos) + uint64(flatbuffers.GetUOffsetT(buf[pos:]))
	if at+4 > uint64(len(buf)) {
		return nil, fmt.Errorf("%w: string past the end of the frame", ErrMalformed)
	}
	n := uint64(flatbuffers.GetUOffsetT(buf[at:]))
	if n > uint64(limit) {
		return nil, fmt.Errorf("%w: %d-byte string (limit %d)", ErrLimit, n, limit)
	}
	if at+4+n > uint64(len(buf)) {
		return nil, fmt.Errorf("%w: string past the end of the frame", ErrMalformed)
	}
	return buf[at+4 : at+4+n], nil
}

// summary is a BatchSummary struct field, stored inline, always written.
func summary(f *fields, slot int, v *Summary) {
	switch f.pass {
	case decoding:
		if f.err != nil {
			return
		}
		*v = Summary{}
		if o := f.at(slot); o != 0 {
			var s tcproto.BatchSummary
			s.Init(f.tab.Bytes, o)
			*v = Summary{s.Total(), s.Waiting(), s.Pending(), s.Completed(), s.Failed(), s.Timeout(), s.Canceled(), s.Transferred()}
		}
	case creating:
		f.created(slot, 0)
	case adding:
		f.b.PrependStructSlot(slot, tcproto.CreateBatchSummary(f.b, v.Total, v.Waiting, v.Pending, v.Completed, v.Failed,
			v.Timeout, v.Canceled, v.Transferred), 0)
	}
}

// transferRequestSize is the wire size of one TransferRequest struct.
const transferRequestSize = 48

// transfers is a required, non-empty vector of TransferRequest structs of
// at most lim.MaxRequests elements.
func transfers(f *fields, slot int, v *[]xfer.Request) {
	switch f.pass {
	case decoding:
		if f.err != nil {
			return
		}
		n, start, err := vecAt(&f.tab, vtableOffset(slot), transferRequestSize, f.lim.MaxRequests)
		*v = (*v)[:0]
		var tr tcproto.TransferRequest
		for i := 0; err == nil && i < n; i++ {
			tr.Init(f.tab.Bytes, start+flatbuffers.UOffsetT(i*transferRequestSize))
			*v = append(*v, xfer.Request{Op: xfer.Op(tr.Op()), Local: xfer.SegmentID(tr.Local()), LocalOffset: tr.LocalOffset(),
				Target: xfer.SegmentID(tr.Target()), TargetOffset: tr.TargetOffset(), Length: tr.Length()})
		}
		f.fail(err)
		f.require(len(*v) > 0, "no transfer requests")
	case creating:
		f.b.StartVector(transferRequestSize, len(*v), 8)
		for i := len(*v) - 1; i >= 0; i-- {
			r := &(*v)[i]
			tcproto.CreateTransferRequest(f.b, uint64(r.Local), r.LocalOffset, uint64(r.Target), r.TargetOffset, r.Length, tcproto.Op(r.Op))
		}
		f.created(slot, f.b.EndVector(len(*v)))
	case adding:
		f.addChild(slot)
	}
}

// notify is the optional positional vector of Notify tables beside n
// transfer requests: empty, or one payload (nil for none) per request,
// each at most MaxNotify bytes. It is left out when empty.
func notify(f *fields, slot int, v *[][]byte, n int) {
	switch f.pass {
	case decoding:
		if f.err != nil {
			return
		}
		*v = (*v)[:0]
		offsetsAt(f, slot, n, func(_ int, pos flatbuffers.UOffsetT) error {
			tab := flatbuffers.Table{Bytes: f.tab.Bytes, Pos: pos + flatbuffers.GetUOffsetT(f.tab.Bytes[pos:])}
			p, err := bytesField(&tab, vtableOffset(0), MaxNotify)
			*v = append(*v, p)
			return err
		})
		if f.reading() && len(*v) != 0 && len(*v) != n {
			f.fail(fmt.Errorf("%w: %d notify entries for %d requests", ErrMalformed, len(*v), n))
		}
	case creating:
		createOffsets(f, slot, len(*v), true, func(i int) flatbuffers.UOffsetT {
			var c flatbuffers.UOffsetT
			if p := (*v)[i]; len(p) > 0 {
				c = f.b.CreateByteVector(p)
			}
			tcproto.NotifyStart(f.b)
			if c != 0 {
				tcproto.NotifyAddPayload(f.b, c)
			}
			return tcproto.NotifyEnd(f.b)
		})
	case adding:
		f.addChild(slot)
	}
}

// body is a union field: its tag in slot, its table in slot+1. A decoded
// body is one of *spare, made by makers on first use; an absent one is nil
// (its tag must then be NONE).
func body[K ~uint8, B interface {
	Kind() K
	table
}](f *fields, slot int, v *B, spare *[]B, makers []func() B) {
	var none B
	switch f.pass {
	case decoding:
		if f.err != nil {
			return
		}
		var k K
		scalar(f, slot, &k)
		*v = none
		o := f.at(slot + 1)
		if o == 0 {
			if k != 0 {
				f.fail(fmt.Errorf("%w: body type %d without a body", ErrMalformed, k))
			}
			return
		}
		b, ok := reuse(spare, makers, k)
		if !ok {
			f.fail(fmt.Errorf("%w: unknown body %d", ErrMalformed, k))
			return
		}
		outer := f.tab
		f.tab = flatbuffers.Table{Bytes: outer.Bytes, Pos: outer.Indirect(o)}
		b.fields(f)
		f.tab = outer
		*v = b
	case creating:
		var c flatbuffers.UOffsetT
		if any(*v) != nil {
			c = f.build(*v)
		}
		f.created(slot, 0)
		f.created(slot+1, c)
	case adding:
		if f.child[f.depth][slot+1] != 0 {
			k := (*v).Kind()
			scalar(f, slot, &k)
			f.addChild(slot + 1)
		}
	}
}
