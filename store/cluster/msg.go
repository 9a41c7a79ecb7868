package cluster

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/tensorcast/tensorcast/store"
)

// The messages of the store across hosts, one exchange each (little
// endian). Every message begins with its version byte.
//
//	announce  keys → their home: u32 n, n × (key, u8 tier, u64 size, u32 crc);
//	          tier 0: the holder no longer has the value
//	          answer: u32 refused (keys the home is not home of), u32 m,
//	          m × u32 position (copies removed meanwhile: drop them)
//	announce.ages
//	          the same; its answer then has m × u32 age ms of each
//	          one's removal (a value put here since stays: apart.go)
//	lookup    keys → their home: u32 n, n × key
//	          answer: u32 n, n × (u8 code, u8 m, m × holder)
//	remove    keys → their home: u32 n, n × key; answer empty, or u32 m,
//	          m × u32 position of the keys it is not home of
//	drop      keys → a holder (from their home): u32 n, n × key (then,
//	          optional, as drop.ages); answer empty: whatever copy the
//	          holder has goes
//	drop.ages a tombstone's drop: u32 n, n × key, n × u32 age ms of each
//	          removal; answer empty, or u32 m, m × u32 position of the
//	          keys kept (a value put since the removal)
//	hold      keys → a holder: u32 ttl ms, u32 n, n × key
//	          answer: u64 claim, u32 n, n × (u8 code, u64 offset, u64 size)
//	release   claim → its holder: u64 claim; answer empty
//
// A key is u16 length + bytes (1..store.MaxKeyLen); a holder is u8 id
// length + id, u64 epoch, u8 tier, u64 size, u32 crc. A code in a lookup
// answer is codeOK (the holders follow) or codeNotHome. A decoder checks
// every length against what is left and against the limits before use, and
// refuses trailing bytes.
//
// A message that gains a part an older release would refuse gets a kind
// of its own (announce.ages, drop.ages): an older release answers that it
// serves no such kind, and is sent the message it knows instead, for a
// while (olderRecheck), so that a rolling upgrade keeps one store and
// never sends a daemon what it would refuse (members.go, older).

const msgVersion = 2

// Exchange kinds.
const (
	kindAnnounce = "tc.store.announce"
	kindLookup   = "tc.store.lookup"
	kindRemove   = "tc.store.remove"
	kindDrop     = "tc.store.drop"
	kindHold     = "tc.store.hold"
	kindRelease  = "tc.store.release"
	// kindReannounce asks a holder to re-announce the keys it holds whose
	// home is the asker (a home that gained shards): empty both ways.
	kindReannounce = "tc.store.reannounce"
	// kindHello asks a member whether it is there: u32 shards both ways
	// (a member with another store_shards refuses, and is out).
	kindHello = "tc.store.hello"
	// kindClaim is a lookup that takes claims (claim.go): u32 ttl ms,
	// u32 n, n × key; answer u32 n, n × (u8 code, u64 claim, u8 m, m ×
	// holder), code codeOK, codeNotHome or codeBusy.
	kindClaim = "tc.store.claim"
	// kindUnclaim releases claims at their home: u32 n, n × u64 claim;
	// answer empty.
	kindUnclaim = "tc.store.unclaim"
	// kindReplicate asks a daemon to copy values from the sender
	// (replica.go): u8 durable, u32 n, n × (key, u64 size, u32 crc);
	// answer u32 n, n × u8 code (a store.Code).
	kindReplicate = "tc.store.replicate"
	// kindTombs hands a shard's tombstones to its new home (tomb.go):
	// u32 n, n × (key, u8 id length + holder id, u64 size, u32 crc, u32
	// age ms); answer empty.
	kindTombs = "tc.store.tombs"
	// kindKeep gives a keeper copies of tombstones its home just made
	// (tomb.go), encoded as kindTombs; answer empty.
	kindKeep = "tc.store.keep"
	// kindAnnounceAges is kindAnnounce answered with the removals' ages;
	// kindDropAges a drop with them (the message list above).
	kindAnnounceAges = "tc.store.announce.ages"
	kindDropAges     = "tc.store.drop.ages"
	// kindPull is kindReannounce numbered (walk.go): u64 pull number,
	// then kindReannounce's request after its version; answer empty.
	// kindWalked is a member's word that a walk of its store begun after
	// that pull announced to the asker every copy of the shards named:
	// u64 pull number, u32 shards, a bit per shard; answer empty.
	kindPull   = "tc.store.pull"
	kindWalked = "tc.store.walked"
)

// Codes of a key in a lookup answer.
const (
	codeOK      = 0
	codeNotHome = 1
)

// maxMsgKeys bounds the keys of one message: a lookup answer for that many
// keys with maxHoldersCap holders each fits one exchange (tcp.MaxExchange).
const (
	maxMsgKeys    = 128
	maxHoldersCap = 4
	maxIDLen      = 64
	// maxMsgBytes is the most a message may take (tcp.MaxExchange).
	maxMsgBytes = 60 << 10
)

// enc builds a message.
type enc struct{ b []byte }

func newEnc() *enc           { return &enc{b: []byte{msgVersion}} }
func (e *enc) u8(v uint8)    { e.b = append(e.b, v) }
func (e *enc) u16(v uint16)  { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *enc) u32(v uint32)  { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *enc) u64(v uint64)  { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *enc) key(k []byte)  { e.u16(uint16(len(k))); e.b = append(e.b, k...) }
func (e *enc) str8(s string) { e.u8(uint8(len(s))); e.b = append(e.b, s...) }
func (e *enc) holder(h Holder) {
	e.str8(h.ID)
	e.u64(h.Epoch)
	e.u8(h.Tier)
	e.u64(h.Size)
	e.u32(h.CRC)
}
func (e *enc) bytes() []byte            { return e.b }
func keyBytes(k []byte) int             { return 2 + len(k) }
func holderBytes(h Holder) int          { return 1 + len(h.ID) + 8 + 1 + 8 + 4 }
func (e *enc) room(n int) bool          { return len(e.b)+n <= maxMsgBytes }
func (e *enc) patch32(at int, v uint32) { binary.LittleEndian.PutUint32(e.b[at:], v) }

// dec reads a message; the first failure sticks.
type dec struct {
	b   []byte
	err error
}

func newDec(b []byte) *dec {
	d := &dec{b: b}
	if v := d.u8(); d.err == nil && v != msgVersion {
		d.fail("version %d", v)
	}
	return d
}

func (d *dec) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrMessage}, args...)...)
	}
	d.b = nil
}

func (d *dec) take(n int) []byte {
	if d.err != nil || n > len(d.b) {
		d.fail("%d bytes wanted, %d left", n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *dec) u16() uint16 {
	if b := d.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *dec) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *dec) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *dec) key() []byte {
	n := int(d.u16())
	if d.err == nil && (n == 0 || n > store.MaxKeyLen) {
		d.fail("key of %d bytes", n)
		return nil
	}
	return d.take(n)
}

func (d *dec) count(most int) int {
	n := int(d.u32())
	if d.err == nil && n > most {
		d.fail("%d items (at most %d)", n, most)
		return 0
	}
	return n
}

func (d *dec) holder() Holder {
	n := int(d.u8())
	if d.err == nil && (n == 0 || n > maxIDLen) {
		d.fail("daemon id of %d bytes", n)
		return Holder{}
	}
	id := string(d.take(n))
	return Holder{ID: id, Epoch: d.u64(), Tier: d.u8(), Size: d.u64(), CRC: d.u32()}
}

func (d *dec) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return d.err
}

// entry is one announced key.
type entry struct {
	key  []byte
	tier uint8
	size uint64
	crc  uint32
	// id is a fetched copy's record here (tierFetched), confirmed once its
	// home has taken it; never sent.
	id store.RecordID
}

func entryBytes(e entry) int { return keyBytes(e.key) + 1 + 8 + 4 }

// encodeAnnounce encodes es (which fit one message).
func encodeAnnounce(es []entry) []byte {
	e := newEnc()
	e.u32(uint32(len(es)))
	for _, x := range es {
		e.key(x.key)
		e.u8(x.tier)
		e.u64(x.size)
		e.u32(x.crc)
	}
	return e.bytes()
}

func decodeAnnounce(b []byte) ([]entry, error) {
	d := newDec(b)
	n := d.count(maxMsgBytes / 16)
	es := make([]entry, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		es = append(es, entry{key: d.key(), tier: d.u8(), size: d.u64(), crc: d.u32()})
	}
	return es, d.end()
}

// encodeKeys encodes a list of keys (lookup, remove, drop).
func encodeKeys(keys [][]byte) []byte {
	e := newEnc()
	e.u32(uint32(len(keys)))
	for _, k := range keys {
		e.key(k)
	}
	return e.bytes()
}

func decodeKeysFrom(d *dec) [][]byte {
	n := d.count(maxMsgBytes / 3)
	keys := make([][]byte, 0, min(n, maxMsgKeys))
	for i := 0; i < n && d.err == nil; i++ {
		keys = append(keys, d.key())
	}
	return keys
}

// Times go in messages as ages: whole milliseconds back from the
// sender's now, taken back from the receiver's (no clock is compared).

// ageMS is d in whole milliseconds for a message, rounded down (a removal
// seen as a little later than it was: a put in that moment is taken as
// made before it) and within a u32.
func ageMS(d time.Duration) uint32 {
	return uint32(min(max(d.Milliseconds(), 0), math.MaxUint32))
}

// ageOf is at's age as of now for a message (0 for a zero at: no time
// known, taken as now).
func ageOf(at, now time.Time) uint32 {
	if at.IsZero() {
		return 0
	}
	return ageMS(now.Sub(at))
}

// atAge is the time age ms before now, as a message tells it.
func atAge(age uint32, now time.Time) time.Time {
	return now.Add(-time.Duration(age) * time.Millisecond)
}

// atsOf is the times of ages before now (nil for nil).
func atsOf(ages []uint32, now time.Time) []time.Time {
	if ages == nil {
		return nil
	}
	ats := make([]time.Time, len(ages))
	for i, a := range ages {
		ats[i] = atAge(a, now)
	}
	return ats
}

// encodeDrop encodes a drop of keys; ages, when set (one per key), are how
// long ago each removal was, in ms.
func encodeDrop(keys [][]byte, ages []uint32) []byte {
	b := encodeKeys(keys)
	for _, a := range ages {
		b = binary.LittleEndian.AppendUint32(b, a)
	}
	return b
}

// decodeDrop decodes a drop: its keys, and their removals' ages when the
// message has them (nil otherwise; aged: it must have them).
func decodeDrop(b []byte, aged bool) (keys [][]byte, ages []uint32, err error) {
	d := newDec(b)
	keys = decodeKeysFrom(d)
	if d.err == nil && (aged || len(d.b) > 0) {
		ages = make([]uint32, len(keys))
		for i := range ages {
			ages[i] = d.u32()
		}
	}
	return keys, ages, d.end()
}

// encodePositions encodes positions (an answer naming some of the keys
// asked: a drop's kept ones); none is the version byte alone.
func encodePositions(ps []int) []byte {
	e := newEnc()
	if len(ps) > 0 {
		e.positions(ps)
	}
	return e.bytes()
}

// positions writes a count and the positions (positionsFrom reads them).
func (e *enc) positions(ps []int) {
	e.u32(uint32(len(ps)))
	for _, p := range ps {
		e.u32(uint32(p))
	}
}

// decodePositions decodes positions of n keys asked.
func decodePositions(b []byte, n int) ([]int, error) {
	d := newDec(b)
	if d.err == nil && len(d.b) == 0 {
		return nil, nil
	}
	ps := positionsFrom(d, n)
	return ps, d.end()
}

func positionsFrom(d *dec, n int) []int {
	m := d.count(n)
	ps := make([]int, 0, m)
	for i := 0; i < m && d.err == nil; i++ {
		p := int(d.u32())
		if d.err == nil && p >= n {
			d.fail("position %d of %d keys", p, n)
		}
		ps = append(ps, p)
	}
	return ps
}

// encodeRemoveAnswer encodes a home's answer to a removal: the positions
// of the keys it is not home of, then those whose copy a holder, a member
// still, did not drop in time (only when there are some: an answer with
// none is encodePositions', which a daemon that never sends the second
// list reads too; one with some fails its decode, so it reports the
// removal not taken rather than taken).
func encodeRemoveAnswer(notHome, kept []int) []byte {
	if len(kept) == 0 {
		return encodePositions(notHome)
	}
	e := newEnc()
	e.positions(notHome)
	e.positions(kept)
	return e.bytes()
}

// decodeRemoveAnswer decodes encodeRemoveAnswer's answer for n keys.
func decodeRemoveAnswer(b []byte, n int) (notHome, kept []int, err error) {
	d := newDec(b)
	if d.err == nil && len(d.b) == 0 {
		return nil, nil, nil
	}
	notHome = positionsFrom(d, n)
	if d.err == nil && len(d.b) > 0 {
		kept = positionsFrom(d, n)
	}
	return notHome, kept, d.end()
}

func decodeKeys(b []byte) ([][]byte, error) {
	d := newDec(b)
	keys := decodeKeysFrom(d)
	return keys, d.end()
}

// lookupAnswer is the home's answer for one key.
type lookupAnswer struct {
	code    uint8
	holders []Holder
	// claim is the claim on holders[0] of a claim lookup (0: none).
	claim uint64
}

func encodeLookupAnswer(as []lookupAnswer) []byte { return encodeAnswers(as, false) }

func decodeLookupAnswer(b []byte, want int) ([]lookupAnswer, error) {
	return decodeAnswers(b, want, false)
}

// encodeAnswers encodes a home's answers: u32 n, n × (u8 code, [u64
// claim when claims], u8 m, m × holder). A lookup's have no claim ids, a
// claim lookup's do (claim.go).
func encodeAnswers(as []lookupAnswer, claims bool) []byte {
	e := newEnc()
	e.u32(uint32(len(as)))
	for _, a := range as {
		e.u8(a.code)
		if claims {
			e.u64(a.claim)
		}
		e.u8(uint8(len(a.holders)))
		for _, h := range a.holders {
			e.holder(h)
		}
	}
	return e.bytes()
}

// decodeAnswers decodes what encodeAnswers wrote for want keys; a claim
// lookup's codes are checked to be known (at most codeBusy).
func decodeAnswers(b []byte, want int, claims bool) ([]lookupAnswer, error) {
	d := newDec(b)
	n := d.count(maxMsgKeys)
	if d.err == nil && n != want {
		d.fail("%d answers for %d keys", n, want)
	}
	as := make([]lookupAnswer, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		a := lookupAnswer{code: d.u8()}
		if claims {
			a.claim = d.u64()
			if d.err == nil && a.code > codeBusy {
				d.fail("code %d", a.code)
			}
		}
		m := int(d.u8())
		if m > maxHoldersCap {
			d.fail("%d holders (at most %d)", m, maxHoldersCap)
		}
		for j := 0; j < m && d.err == nil; j++ {
			a.holders = append(a.holders, d.holder())
		}
		as = append(as, a)
	}
	return as, d.end()
}

func encodeHold(ttlMS uint32, keys [][]byte) []byte {
	e := newEnc()
	e.u32(ttlMS)
	e.u32(uint32(len(keys)))
	for _, k := range keys {
		e.key(k)
	}
	return e.bytes()
}

func decodeHold(b []byte) (ttlMS uint32, keys [][]byte, err error) {
	d := newDec(b)
	ttlMS = d.u32()
	keys = decodeKeysFrom(d)
	if d.err == nil && len(keys) > maxMsgKeys {
		d.fail("%d keys (at most %d)", len(keys), maxMsgKeys)
	}
	return ttlMS, keys, d.end()
}

// held is a holder's answer for one key of a hold.
type held struct {
	code   uint8 // a store.Code
	offset uint64
	size   uint64
}

func encodeHeld(claim uint64, hs []held) []byte {
	e := newEnc()
	e.u64(claim)
	e.u32(uint32(len(hs)))
	for _, h := range hs {
		e.u8(h.code)
		e.u64(h.offset)
		e.u64(h.size)
	}
	return e.bytes()
}

func decodeHeld(b []byte, want int) (uint64, []held, error) {
	d := newDec(b)
	claim := d.u64()
	n := d.count(maxMsgKeys)
	if d.err == nil && n != want {
		d.fail("%d answers for %d keys", n, want)
	}
	hs := make([]held, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		hs = append(hs, held{code: d.u8(), offset: d.u64(), size: d.u64()})
	}
	return claim, hs, d.end()
}

func encodeClaim(claim uint64) []byte {
	e := newEnc()
	e.u64(claim)
	return e.bytes()
}

func decodeClaim(b []byte) (uint64, error) {
	d := newDec(b)
	c := d.u64()
	return c, d.end()
}

// tombBytes is the most one tombstone takes in a kindTombs message.
func tombBytes(key string, holder string) int { return 2 + len(key) + 1 + len(holder) + 8 + 4 + 4 }

// encodeTombs encodes tombstones for their new home, with their ages as
// of now.
func encodeTombs(ts []tomb, now time.Time) []byte {
	e := newEnc()
	e.u32(uint32(len(ts)))
	for _, t := range ts {
		e.key([]byte(t.key))
		e.str8(t.holder)
		e.u64(t.size)
		e.u32(t.crc)
		e.u32(ageOf(t.at, now))
	}
	return e.bytes()
}

// decodeTombs decodes a kindTombs message, each tombstone dated by its
// age back from now.
func decodeTombs(b []byte, now time.Time) ([]tomb, error) {
	d := newDec(b)
	n := d.count(maxMsgKeys)
	ts := make([]tomb, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		k := d.key()
		idLen := int(d.u8())
		if d.err == nil && (idLen == 0 || idLen > maxIDLen) {
			d.fail("holder id of %d bytes", idLen)
		}
		id := d.take(idLen)
		t := tomb{key: string(k), holder: string(id), size: d.u64(), crc: d.u32()}
		t.at = atAge(d.u32(), now)
		ts = append(ts, t)
	}
	return ts, d.end()
}
