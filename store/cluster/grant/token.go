package grant

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"
)

// A retention handle's token: what its holder presents to renew, release
// or prove the handle. It is signed by the issuer with a key derived from
// the cluster key, so any daemon of the cluster can check it, and only a
// daemon with the cluster key can make one.
//
//	u8  version (1)
//	u8  issuer length, issuer daemon id
//	u8  scope length, scope (the issuer's store: its tenant)
//	u64 issuer epoch
//	u64 handle id (unique within the issuer's epoch)
//	i64 expiry, unix nanoseconds
//	u32 number of keys
//	[32] SHA-256 of the keys (each as u16 length + bytes, in order)
//	[32] HMAC-SHA256 of everything before it
//
// All little-endian.
const (
	tokenVersion = 1
	digestLen    = sha256.Size
	macLen       = sha256.Size
	maxIssuerLen = 64
	maxScopeLen  = 64
	fixedLen     = 8 + 8 + 8 + 4 + digestLen // epoch, id, expiry, keys, digest
	// MaxTokenLen is the longest token there is.
	MaxTokenLen = 3 + maxIssuerLen + maxScopeLen + fixedLen + macLen
)

// Token is what a retention handle's token says.
type Token struct {
	Issuer string
	// Scope is the store the handle is of at its issuer (the tenant): a
	// token is good only where the scope is the same.
	Scope  string
	Epoch  uint64
	ID     uint64
	Expiry time.Time
	Keys   uint32
	Digest [digestLen]byte
}

// KeysDigest is the digest of a key set as a token carries it.
func KeysDigest(keys [][]byte) [digestLen]byte {
	h := sha256.New()
	var n [2]byte
	for _, k := range keys {
		binary.LittleEndian.PutUint16(n[:], uint16(len(k)))
		h.Write(n[:])
		h.Write(k)
	}
	var d [digestLen]byte
	h.Sum(d[:0])
	return d
}

// sign encodes t and appends its MAC under key.
func (t *Token) sign(key []byte) []byte {
	b := make([]byte, 0, MaxTokenLen)
	b = append(b, tokenVersion, byte(len(t.Issuer)))
	b = append(b, t.Issuer...)
	b = append(b, byte(len(t.Scope)))
	b = append(b, t.Scope...)
	b = binary.LittleEndian.AppendUint64(b, t.Epoch)
	b = binary.LittleEndian.AppendUint64(b, t.ID)
	b = binary.LittleEndian.AppendUint64(b, uint64(t.Expiry.UnixNano()))
	b = binary.LittleEndian.AppendUint32(b, t.Keys)
	b = append(b, t.Digest[:]...)
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return m.Sum(b)
}

// openToken decodes b and checks its MAC under key: ErrForged for anything
// that is not a whole token the cluster signed.
func openToken(b, key []byte) (Token, error) {
	var t Token
	if len(b) < 2 || len(b) > MaxTokenLen || b[0] != tokenVersion {
		return t, fmt.Errorf("%w: %d bytes", ErrForged, len(b))
	}
	il := int(b[1])
	if il == 0 || il > maxIssuerLen || len(b) < 3+il {
		return t, fmt.Errorf("%w: %d bytes with an issuer of %d", ErrForged, len(b), il)
	}
	sl := int(b[2+il])
	if sl > maxScopeLen || len(b) != 3+il+sl+fixedLen+macLen {
		return t, fmt.Errorf("%w: %d bytes with an issuer of %d and a scope of %d", ErrForged, len(b), il, sl)
	}
	body := b[:len(b)-macLen]
	m := hmac.New(sha256.New, key)
	m.Write(body)
	if !hmac.Equal(m.Sum(nil), b[len(body):]) {
		return t, fmt.Errorf("%w: signature", ErrForged)
	}
	t.Issuer = string(b[2 : 2+il])
	t.Scope = string(b[3+il : 3+il+sl])
	r := b[3+il+sl:]
	t.Epoch = binary.LittleEndian.Uint64(r)
	t.ID = binary.LittleEndian.Uint64(r[8:])
	t.Expiry = time.Unix(0, int64(binary.LittleEndian.Uint64(r[16:])))
	t.Keys = binary.LittleEndian.Uint32(r[24:])
	copy(t.Digest[:], r[28:])
	return t, nil
}
