package wire

import (
	"encoding/binary"
	"fmt"
)

// A key list is how a store call carries its keys, on the socket (the
// keys field of the store messages) and on a queue (in the data area; see
// package queue): for each key a u16 little-endian length, then the key's
// bytes, nothing between keys. The store refuses keys over MaxStoreKey
// bytes (and empty ones) with a per-key INVALID_ARGUMENT; the format
// itself carries any length up to MaxPackedKey.
const (
	// MaxStoreKey is the longest key the store accepts.
	MaxStoreKey = 256
	// MaxPackedKey is the longest key a key list can carry.
	MaxPackedKey = 1<<16 - 1
	// KeyHeader is the bytes of a key's length prefix.
	KeyHeader = 2
)

// KeysLen is how many bytes keys take packed, or -1 when one is longer
// than MaxPackedKey.
func KeysLen(keys [][]byte) int {
	n := 0
	for _, k := range keys {
		if len(k) > MaxPackedKey {
			return -1
		}
		n += KeyHeader + len(k)
	}
	return n
}

// PutKeys packs keys into dst, which must hold KeysLen(keys) bytes, and
// returns how many it wrote.
func PutKeys(dst []byte, keys [][]byte) int {
	n := 0
	for _, k := range keys {
		binary.LittleEndian.PutUint16(dst[n:], uint16(len(k)))
		n += KeyHeader
		n += copy(dst[n:], k)
	}
	return n
}

// AppendKeys appends keys packed to dst (keys longer than MaxPackedKey are
// the caller's to refuse: KeysLen).
func AppendKeys(dst []byte, keys [][]byte) []byte {
	for _, k := range keys {
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(k)))
		dst = append(dst, k...)
	}
	return dst
}

// SplitKeys splits a packed key list into dst[:0] (the keys alias packed)
// and returns it. It fails with ErrMalformed when a length runs past the
// end of packed, and with ErrLimit past max keys. It allocates only when
// dst has to grow.
func SplitKeys(packed []byte, dst [][]byte, max int) ([][]byte, error) {
	dst = dst[:0]
	for len(packed) > 0 {
		if len(dst) == max {
			return dst, fmt.Errorf("%w: more than %d keys", ErrLimit, max)
		}
		if len(packed) < KeyHeader {
			return dst, fmt.Errorf("%w: key list ends inside a key's length", ErrMalformed)
		}
		n := int(binary.LittleEndian.Uint16(packed))
		packed = packed[KeyHeader:]
		if n > len(packed) {
			return dst, fmt.Errorf("%w: a %d-byte key with %d bytes left in the key list", ErrMalformed, n, len(packed))
		}
		dst = append(dst, packed[:n:n])
		packed = packed[n:]
	}
	return dst, nil
}
