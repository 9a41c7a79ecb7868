package tcp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Rights is what a capability token allows on a remote segment.
type Rights uint8

const (
	// RightRead allows READ (target → local).
	RightRead Rights = 1 << iota
	// RightWrite allows WRITE (local → target) and notifications.
	RightWrite
)

func (r Rights) String() string {
	switch r {
	case RightRead:
		return "r"
	case RightWrite:
		return "w"
	case RightRead | RightWrite:
		return "rw"
	}
	return "none"
}

const (
	maxNameLen = 255
	maxIDLen   = 64
	// MaxTenant bounds a tenant's name in the protocol.
	MaxTenant = 64
	// tokenV1 is the token of a request without tenants (the default
	// tenant's, as daemons before tenants ask and check it); tokenV2 adds
	// the tenants of the access.
	tokenV1 = 1
	tokenV2 = 2
)

// Access is what a peer's request asks of an export: the export named
// Name of tenant Owner, for a client of tenant Tenant on the asking
// daemon. An empty Owner is the asker's own tenant; an empty Tenant is
// the default tenant, which the protocol leaves out, so that an access
// with both empty is asked and granted as by daemons before tenants. The
// exporter decides who reaches what (Exporter.Lookup); the node carries
// the access in the open request and binds it into the token.
type Access struct {
	Tenant, Owner, Name string
}

// token is a capability the owner of a segment issues: it names the
// access it grants (segment, and with tenants the asker's and the
// export's tenant), the rights, an expiry and the issuer (daemon id and
// epoch), signed with a key derived from the cluster key. The owner checks
// every field of it on every data request and refuses anything uncertain.
// An access without tenants gets a version 1 token, which daemons before
// tenants read; one with tenants a version 2 token, which they refuse.
type token struct {
	access Access
	rights Rights
	expiry int64 // unix nanoseconds
	issuer string
	epoch  uint64
	mac    []byte
}

func (t *token) body(b []byte) []byte {
	v2 := t.access.Tenant != "" || t.access.Owner != ""
	if v2 {
		b = append(b, tokenV2)
	} else {
		b = append(b, tokenV1)
	}
	b = appendStr8(b, t.access.Name)
	b = append(b, byte(t.rights))
	b = binary.LittleEndian.AppendUint64(b, uint64(t.expiry))
	b = appendStr8(b, t.issuer)
	b = binary.LittleEndian.AppendUint64(b, t.epoch)
	if v2 {
		b = appendStr8(b, t.access.Tenant)
		b = appendStr8(b, t.access.Owner)
	}
	return b
}

// sign encodes t with its MAC under key.
func (t *token) sign(key []byte) []byte {
	b := t.body(nil)
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return m.Sum(b)
}

// decodeToken parses a token without checking its MAC.
func decodeToken(b []byte) (token, error) {
	var t token
	if len(b) < macLen+1 {
		return t, fmt.Errorf("%w: token of %d bytes", ErrFrame, len(b))
	}
	r := reader{b: b[:len(b)-macLen]}
	v := r.u8()
	if v != tokenV1 && v != tokenV2 {
		return t, fmt.Errorf("%w: token version %d", ErrFrame, v)
	}
	t.access.Name = r.str8(maxNameLen)
	t.rights = Rights(r.u8())
	t.expiry = int64(r.u64())
	t.issuer = r.str8(maxIDLen)
	t.epoch = r.u64()
	if v == tokenV2 {
		t.access.Tenant = r.str8(MaxTenant)
		t.access.Owner = r.str8(MaxTenant)
		if r.err == nil && t.access.Tenant == "" && t.access.Owner == "" {
			return t, fmt.Errorf("%w: version 2 token without tenants", ErrFrame)
		}
	}
	if err := r.done(); err != nil {
		return t, err
	}
	t.mac = b[len(b)-macLen:]
	return t, nil
}

// verifyToken checks a token for the owner (self, epoch): MAC, issuer,
// epoch, expiry and that it grants need (zero: any rights). Every failure wraps
// xfer.ErrPermission.
func verifyToken(b []byte, key []byte, self string, epoch uint64, need Rights, now time.Time) (token, error) {
	t, err := decodeToken(b)
	if err != nil {
		return t, fmt.Errorf("%w: %w", xfer.ErrPermission, err)
	}
	m := hmac.New(sha256.New, key)
	m.Write(b[:len(b)-macLen])
	if !hmac.Equal(m.Sum(nil), t.mac) {
		return t, fmt.Errorf("%w: token signature invalid", xfer.ErrPermission)
	}
	if t.issuer != self {
		return t, fmt.Errorf("%w: token issued by %q, not this daemon", xfer.ErrPermission, t.issuer)
	}
	if t.epoch != epoch {
		return t, fmt.Errorf("%w: token from epoch %#x, current epoch %#x", xfer.ErrPermission, t.epoch, epoch)
	}
	if now.UnixNano() >= t.expiry {
		return t, fmt.Errorf("%w: token expired", xfer.ErrPermission)
	}
	if t.rights&need != need {
		return t, fmt.Errorf("%w: token grants %v, request needs %v", xfer.ErrPermission, t.rights, need)
	}
	return t, nil
}
