package directory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Limits on what the directory stores and reads back. Values come from a
// shared store other daemons write to, so they are outside bytes: each is
// bounded before it is decoded and checked after.
const (
	// MaxNameLen bounds an export's name (as tcp and control do).
	MaxNameLen = 255
	// MaxRecord bounds one encoded member or export record.
	MaxRecord = 4096
	// MaxCaps bounds a member's capabilities, MaxCapLen each one.
	MaxCaps   = 16
	MaxCapLen = 32
	maxField  = 256 // an address, an RDMA device or GID
)

// Rights an export grants, as tcp.Rights and control spell them.
const (
	RightRead  uint8 = 1
	RightWrite uint8 = 2
)

// Member is one daemon as the multi-host directory records it: registered
// by the daemon itself under a lease it keeps alive, so it disappears when
// the daemon stops renewing it.
type Member struct {
	ID string `json:"id"`
	// Epoch is the daemon's current run (its tcp node's epoch); a restart
	// registers a new one.
	Epoch uint64 `json:"epoch"`
	// Addr is the host:port of its peer listener.
	Addr string `json:"addr"`
	// RDMA is how the daemon is reached by RDMA; nil without a device.
	RDMA *RDMAAddr `json:"rdma,omitempty"`
	// Caps are its capabilities ("tcp", "rdma", "notify").
	Caps []string `json:"caps,omitempty"`
	// Started is when the daemon registered, unix milliseconds.
	Started int64 `json:"started"`
}

// RDMAAddr is a daemon's RDMA addressing as its RDMA plane reports it.
type RDMAAddr struct {
	Device string `json:"device"`
	Port   uint32 `json:"port"`
	GID    string `json:"gid"`
	MTU    uint32 `json:"mtu"`
}

// Export is one segment a daemon exports, as its catalog entry: the owner
// issues the tokens (the catalog only says where to ask).
type Export struct {
	Owner  string `json:"owner"`
	Name   string `json:"name"`
	Size   uint64 `json:"size"`
	Rights uint8  `json:"rights"`
	// Epoch is the owner's epoch when it exported the segment, Generation
	// the owner's count of exports in that epoch: together they name this
	// export, so a name exported again is told apart from the old one.
	Epoch      uint64 `json:"epoch"`
	Generation uint64 `json:"gen"`
}

// Key names the export as OpenRemote does: "owner/name".
func (e Export) Key() string { return e.Owner + "/" + e.Name }

func validName(kind, s string, max int) error {
	if s == "" || len(s) > max || strings.ContainsAny(s, "/ \t\n\x00") {
		return fmt.Errorf("%w: %s %q must be 1..%d bytes without '/', spaces or NUL", ErrInvalid, kind, s, max)
	}
	return nil
}

// Validate checks every field of m.
func (m *Member) Validate() error {
	if err := validName("member id", m.ID, MaxIDLen); err != nil {
		return err
	}
	if m.Epoch == 0 {
		return fmt.Errorf("%w: member %q has epoch 0", ErrInvalid, m.ID)
	}
	if m.Addr == "" || len(m.Addr) > maxField {
		return fmt.Errorf("%w: member %q address %q", ErrInvalid, m.ID, m.Addr)
	}
	if len(m.Caps) > MaxCaps {
		return fmt.Errorf("%w: member %q has %d capabilities (max %d)", ErrInvalid, m.ID, len(m.Caps), MaxCaps)
	}
	for _, c := range m.Caps {
		if err := validName("capability", c, MaxCapLen); err != nil {
			return err
		}
	}
	if r := m.RDMA; r != nil && (len(r.Device) > maxField || len(r.GID) > maxField) {
		return fmt.Errorf("%w: member %q RDMA address too long", ErrInvalid, m.ID)
	}
	return nil
}

// Has reports whether m lists capability c.
func (m *Member) Has(c string) bool {
	for _, x := range m.Caps {
		if x == c {
			return true
		}
	}
	return false
}

// StartedAt is Started as a time.
func (m *Member) StartedAt() time.Time { return time.UnixMilli(m.Started) }

// Validate checks every field of e.
func (e *Export) Validate() error {
	if err := validName("export owner", e.Owner, MaxIDLen); err != nil {
		return err
	}
	if err := validName("export name", e.Name, MaxNameLen); err != nil {
		return err
	}
	if e.Rights == 0 || e.Rights&^(RightRead|RightWrite) != 0 {
		return fmt.Errorf("%w: export %s rights %d", ErrInvalid, e.Key(), e.Rights)
	}
	if e.Size == 0 || e.Epoch == 0 || e.Generation == 0 {
		return fmt.Errorf("%w: export %s needs a size, an epoch and a generation", ErrInvalid, e.Key())
	}
	return nil
}

// encodeRecord renders a record for the store.
func encodeRecord(v interface{ Validate() error }) ([]byte, error) {
	if err := v.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(b) > MaxRecord {
		return nil, fmt.Errorf("%w: record of %d bytes (max %d)", ErrInvalid, len(b), MaxRecord)
	}
	return b, nil
}

// decodeStrict parses one JSON object into v: bounded, no unknown fields,
// nothing after it.
func decodeStrict(b []byte, v any) error {
	if len(b) > MaxRecord {
		return fmt.Errorf("%w: record of %d bytes (max %d)", ErrInvalid, len(b), MaxRecord)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	// Only JSON whitespace may follow. (Decoder.More is not this check:
	// it reports a closing bracket as the end, so "{...}}" would pass.)
	if rest := b[d.InputOffset():]; len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return fmt.Errorf("%w: data after the record", ErrInvalid)
	}
	return nil
}

// DecodeMember parses and checks a member record read from the store.
func DecodeMember(b []byte) (Member, error) {
	var m Member
	if err := decodeStrict(b, &m); err != nil {
		return Member{}, err
	}
	if err := m.Validate(); err != nil {
		return Member{}, err
	}
	return m, nil
}

// DecodeExport parses and checks an export record read from the store.
func DecodeExport(b []byte) (Export, error) {
	var e Export
	if err := decodeStrict(b, &e); err != nil {
		return Export{}, err
	}
	if err := e.Validate(); err != nil {
		return Export{}, err
	}
	return e, nil
}

// EncodeMember renders a member record for the store, checking it first.
func EncodeMember(m Member) ([]byte, error) { return encodeRecord(&m) }

// EncodeExport renders an export record for the store, checking it first.
func EncodeExport(e Export) ([]byte, error) { return encodeRecord(&e) }
