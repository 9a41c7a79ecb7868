package store

import (
	"encoding/binary"
	"errors"

	crc "github.com/tensorcast/tensorcast/internal/crc32c"
)

// The L2 on-disk format. Everything is little-endian; every header lives in
// the first bytes of its own Align-sized sector, the rest of the sector is
// zero. There are three kinds, told apart by their magic:
//
//	superblock  at file offset 0: the geometry (Align, RegionSize), the
//	            file's nonce and the number of regions in use. Written
//	            when an empty file is formatted, and again only when the
//	            L2 is opened with another size (resized).
//	region      at the start of each region: the slot size the region is
//	            cut into and a random nonce, new each time the region is
//	            given to a slot size.
//	block       at the start of each used slot, followed by the value in the
//	            slot's next sectors: the key, the value's length and crc32c,
//	            a sequence number, the region's nonce and the header's own
//	            file offset.
//
// Fixed part of every header (56 bytes), then a block header's key:
//
//	 0  magic      [8]byte   "TCSTSUP1" / "TCSTREG1" / "TCSTBLK1"
//	 8  version    uint16    1
//	10  keyLen     uint16    block: 1..256; others: 0
//	12  units      uint32    super: Align; region and block: slot size in sectors
//	16  seq        uint64    super: regions in use (the nonce in files formatted
//	                         before it was kept); region: the file's nonce;
//	                         block: when written
//	24  nonce      uint64    super: the file's; region and block: the region's
//	32  offset     uint64    super: RegionSize; others: the header's file offset
//	40  valueLen   uint64    block: the value's length; others: 0
//	48  valueCRC   uint32    block: crc32c of the value; others: 0
//	52  headerCRC  uint32    crc32c of bytes [0, 56+keyLen) with this field zero
//	56  key        [keyLen]byte
//
// A block's header is written only after its value has been written in full,
// and a slot is reused only after its old header has been overwritten with
// zeros (or by the next block's header in the same slot), so a header that
// decodes describes a value that is entirely on the device. The region nonce
// makes headers left over from an earlier use of the region (another slot
// size) or forged inside a value (values are client bytes) fail to match,
// and the file nonce in each region header does the same for regions left
// over from an earlier format of the file. Regions cut off by a smaller L2
// have their headers zeroed before the L2 grows past them again.
const (
	// seqLimit bounds a block's sequence number: a store numbers its
	// blocks from 1 on, and reaches 2^62 after millennia of puts. Recovery
	// goes on from the highest number it finds, so a header past it
	// (forged or corrupt, its checksum matching) would wrap the numbers
	// of later blocks past zero, and an older copy of a key then win over
	// a newer one; such a header counts as damaged.
	seqLimit = 1 << 62

	hdrFixed      = 56
	hdrMax        = hdrFixed + MaxKeyLen // fits in 512 bytes
	formatVersion = 1
)

var (
	magicSuper  = [8]byte{'T', 'C', 'S', 'T', 'S', 'U', 'P', '1'}
	magicRegion = [8]byte{'T', 'C', 'S', 'T', 'R', 'E', 'G', '1'}
	magicBlock  = [8]byte{'T', 'C', 'S', 'T', 'B', 'L', 'K', '1'}
)

// crc32c is the checksum of values and headers (package crc32c: the same
// values as hash/crc32's Castagnoli, faster over values read by DMA).
func crc32c(b []byte) uint32 { return crc.Checksum(b) }

// Decoding outcomes other than success.
var (
	// errBlank: the sector holds no header (all zero in its header bytes).
	errBlank = errors.New("store: blank sector")
	// errForeign: the sector holds bytes that are not a tensorcast header
	// of the expected kind.
	errForeign = errors.New("store: not a tensorcast header")
	// errDamaged: the magic matches but the header does not check out (a
	// torn or corrupt write, an unknown version, fields out of range).
	errDamaged = errors.New("store: damaged header")
)

// header is a decoded header of any kind; see the layout above.
type header struct {
	magic    [8]byte
	units    uint32
	seq      uint64
	nonce    uint64
	offset   uint64
	valueLen uint64
	valueCRC uint32
	key      []byte // block only; aliases the decoded buffer
}

// encodeHeader writes h into sector (at least hdrMax bytes long) and zeroes
// the rest of its first hdrMax bytes. It returns the header's length.
func encodeHeader(sector []byte, h *header) int {
	n := hdrFixed + len(h.key)
	b := sector[:hdrMax]
	copy(b[0:8], h.magic[:])
	binary.LittleEndian.PutUint16(b[8:], formatVersion)
	binary.LittleEndian.PutUint16(b[10:], uint16(len(h.key)))
	binary.LittleEndian.PutUint32(b[12:], h.units)
	binary.LittleEndian.PutUint64(b[16:], h.seq)
	binary.LittleEndian.PutUint64(b[24:], h.nonce)
	binary.LittleEndian.PutUint64(b[32:], h.offset)
	binary.LittleEndian.PutUint64(b[40:], h.valueLen)
	binary.LittleEndian.PutUint32(b[48:], h.valueCRC)
	binary.LittleEndian.PutUint32(b[52:], 0)
	copy(b[hdrFixed:n], h.key)
	clear(b[n:])
	binary.LittleEndian.PutUint32(b[52:], crc32c(b[:n]))
	return n
}

// decodeHeader decodes the header at the start of sector, which must carry
// the magic want. It checks only what the bytes themselves say (magic,
// version, lengths, checksum); where the header sits and what it must agree
// with is the scanner's business. The key aliases sector.
func decodeHeader(sector []byte, want [8]byte) (header, error) {
	var h header
	if len(sector) < hdrFixed {
		return h, errDamaged
	}
	if [8]byte(sector[0:8]) != want {
		for _, c := range sector[:min(len(sector), hdrMax)] {
			if c != 0 {
				return h, errForeign
			}
		}
		return h, errBlank
	}
	if binary.LittleEndian.Uint16(sector[8:]) != formatVersion {
		return h, errDamaged
	}
	klen := int(binary.LittleEndian.Uint16(sector[10:]))
	isBlock := want == magicBlock
	if isBlock && (klen < 1 || klen > MaxKeyLen) || !isBlock && klen != 0 {
		return h, errDamaged
	}
	n := hdrFixed + klen
	if n > len(sector) {
		return h, errDamaged
	}
	sum := binary.LittleEndian.Uint32(sector[52:])
	var fixed [hdrFixed]byte
	copy(fixed[:], sector[:hdrFixed])
	binary.LittleEndian.PutUint32(fixed[52:], 0)
	if crc.Update(crc32c(fixed[:]), sector[hdrFixed:n]) != sum {
		return h, errDamaged
	}
	h.magic = want
	h.units = binary.LittleEndian.Uint32(sector[12:])
	h.seq = binary.LittleEndian.Uint64(sector[16:])
	h.nonce = binary.LittleEndian.Uint64(sector[24:])
	h.offset = binary.LittleEndian.Uint64(sector[32:])
	h.valueLen = binary.LittleEndian.Uint64(sector[40:])
	h.valueCRC = binary.LittleEndian.Uint32(sector[48:])
	if isBlock {
		h.key = sector[hdrFixed:n:n]
	} else if h.valueLen != 0 || h.valueCRC != 0 {
		return header{}, errDamaged
	}
	return h, nil
}
