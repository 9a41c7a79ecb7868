package rdma

import (
	"encoding/binary"
	"fmt"
)

// MTU is a path MTU as verbs encode it (enum ibv_mtu).
type MTU uint8

// The ibv_mtu values.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes is the MTU in bytes (0 for an invalid value).
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// Limits of connection data, so that a decoder never allocates more than a
// few hundred KiB whatever it is given.
const (
	MaxConnRegions = 64
	// MaxRegionKeys bounds the chunks of one region (4 TiB at 1 GiB each).
	MaxRegionKeys = 4096
)

// ConnInfo is what one side of an RC queue pair tells the other so that
// both can move to RTR and RTS, plus the regions it lets the other side
// read and write. The peer channel carries it as MarshalBinary's bytes.
type ConnInfo struct {
	// QPIndex is the queue pair's position in its transport's set.
	QPIndex uint16
	QPN     uint32 // 24 bits
	PSN     uint32 // 24 bits: the first packet sequence number it sends
	LID     uint16 // 0 on RoCE
	MTU     MTU
	GID     GID
	Regions []RemoteRegion
}

const (
	connMagic   = "TCRQ"
	connVersion = 1
	connHeader  = 4 + 1 + 2 + 4 + 4 + 2 + 1 + 16 + 2
	regionFixed = 8 + 8 + 8 + 1 + 2
)

func (c *ConnInfo) validate() error {
	switch {
	case c.QPN >= 1<<24:
		return fmt.Errorf("%w: qpn %#x exceeds 24 bits", ErrConnInfo, c.QPN)
	case c.PSN >= 1<<24:
		return fmt.Errorf("%w: psn %#x exceeds 24 bits", ErrConnInfo, c.PSN)
	case c.MTU.Bytes() == 0:
		return fmt.Errorf("%w: mtu %d", ErrConnInfo, c.MTU)
	case len(c.Regions) > MaxConnRegions:
		return fmt.Errorf("%w: %d regions (max %d)", ErrConnInfo, len(c.Regions), MaxConnRegions)
	}
	for i := range c.Regions {
		r := &c.Regions[i]
		if len(r.RKeys) > MaxRegionKeys {
			return fmt.Errorf("%w: region %d has %d keys (max %d)", ErrConnInfo, i, len(r.RKeys), MaxRegionKeys)
		}
		if _, err := r.table(); err != nil {
			return fmt.Errorf("%w: region %d: %v", ErrConnInfo, i, err)
		}
	}
	return nil
}

// MarshalBinary encodes c (little-endian, versioned). It fails with
// ErrConnInfo when a field is out of range.
func (c *ConnInfo) MarshalBinary() ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	n := connHeader
	for _, r := range c.Regions {
		n += regionFixed + 4*len(r.RKeys)
	}
	b := make([]byte, 0, n)
	b = append(b, connMagic...)
	b = append(b, connVersion)
	b = binary.LittleEndian.AppendUint16(b, c.QPIndex)
	b = binary.LittleEndian.AppendUint32(b, c.QPN)
	b = binary.LittleEndian.AppendUint32(b, c.PSN)
	b = binary.LittleEndian.AppendUint16(b, c.LID)
	b = append(b, byte(c.MTU))
	b = append(b, c.GID[:]...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Regions)))
	for i := range c.Regions {
		b = c.Regions[i].appendTo(b)
	}
	return b, nil
}

// appendTo appends the region's encoding (fields checked by the caller).
func (r *RemoteRegion) appendTo(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, r.Name)
	b = binary.LittleEndian.AppendUint64(b, r.Addr)
	b = binary.LittleEndian.AppendUint64(b, r.Size)
	b = append(b, byte(len64(r.ChunkSize)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.RKeys)))
	for _, k := range r.RKeys {
		b = binary.LittleEndian.AppendUint32(b, k)
	}
	return b
}

// decodeRegion decodes one region's encoding from the front of b and
// returns the bytes after it. Its fields are not cross-checked (table does).
func decodeRegion(b []byte) (RemoteRegion, []byte, error) {
	var r RemoteRegion
	if len(b) < regionFixed {
		return r, nil, fmt.Errorf("%w: region truncated", ErrConnInfo)
	}
	le := binary.LittleEndian
	r.Name = le.Uint64(b)
	r.Addr = le.Uint64(b[8:])
	r.Size = le.Uint64(b[16:])
	shift := b[24]
	nk := int(le.Uint16(b[25:]))
	b = b[regionFixed:]
	if shift > 62 {
		return r, nil, fmt.Errorf("%w: chunk shift %d", ErrConnInfo, shift)
	}
	r.ChunkSize = 1 << shift
	if nk > MaxRegionKeys || len(b) < 4*nk {
		return r, nil, fmt.Errorf("%w: %d keys for %d bytes", ErrConnInfo, nk, len(b))
	}
	r.RKeys = make([]uint32, nk)
	for k := range nk {
		r.RKeys[k] = le.Uint32(b[4*k:])
	}
	return r, b[4*nk:], nil
}

const (
	regionMagic   = "TCRR"
	regionVersion = 1
)

// MarshalBinary encodes one region on its own (versioned), as a daemon
// describes an exported segment's registration to a peer. It fails with
// ErrConnInfo when the fields disagree.
func (r RemoteRegion) MarshalBinary() ([]byte, error) {
	if len(r.RKeys) > MaxRegionKeys {
		return nil, fmt.Errorf("%w: %d keys (max %d)", ErrConnInfo, len(r.RKeys), MaxRegionKeys)
	}
	if _, err := r.table(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConnInfo, err)
	}
	b := make([]byte, 0, len(regionMagic)+1+regionFixed+4*len(r.RKeys))
	b = append(b, regionMagic...)
	b = append(b, regionVersion)
	return r.appendTo(b), nil
}

// UnmarshalBinary decodes what MarshalBinary produced; malformed input
// fails with ErrConnInfo and leaves r unchanged.
func (r *RemoteRegion) UnmarshalBinary(b []byte) error {
	if len(b) < len(regionMagic)+1 || string(b[:len(regionMagic)]) != regionMagic {
		return fmt.Errorf("%w: not a region description", ErrConnInfo)
	}
	if v := b[len(regionMagic)]; v != regionVersion {
		return fmt.Errorf("%w: region version %d (know %d)", ErrConnInfo, v, regionVersion)
	}
	d, rest, err := decodeRegion(b[len(regionMagic)+1:])
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrConnInfo, len(rest))
	}
	if _, err := d.table(); err != nil {
		return fmt.Errorf("%w: %v", ErrConnInfo, err)
	}
	*r = d
	return nil
}

// len64 is log2 of a power of two.
func len64(x uint64) int {
	n := 0
	for x > 1 {
		x >>= 1
		n++
	}
	return n
}

// UnmarshalBinary decodes what MarshalBinary produced. Any malformed input
// (short, trailing bytes, unknown version, out-of-range fields, counts past
// the limits) fails with ErrConnInfo and leaves c unchanged.
func (c *ConnInfo) UnmarshalBinary(b []byte) error {
	if len(b) < connHeader {
		return fmt.Errorf("%w: %d bytes, want at least %d", ErrConnInfo, len(b), connHeader)
	}
	if string(b[:4]) != connMagic {
		return fmt.Errorf("%w: bad magic %q", ErrConnInfo, b[:4])
	}
	if b[4] != connVersion {
		return fmt.Errorf("%w: version %d (know %d)", ErrConnInfo, b[4], connVersion)
	}
	var d ConnInfo
	le := binary.LittleEndian
	d.QPIndex = le.Uint16(b[5:])
	d.QPN = le.Uint32(b[7:])
	d.PSN = le.Uint32(b[11:])
	d.LID = le.Uint16(b[15:])
	d.MTU = MTU(b[17])
	copy(d.GID[:], b[18:34])
	nr := int(le.Uint16(b[34:]))
	if nr > MaxConnRegions {
		return fmt.Errorf("%w: %d regions (max %d)", ErrConnInfo, nr, MaxConnRegions)
	}
	b = b[connHeader:]
	if nr > 0 {
		d.Regions = make([]RemoteRegion, nr)
	}
	for i := range nr {
		var err error
		if d.Regions[i], b, err = decodeRegion(b); err != nil {
			return fmt.Errorf("region %d: %w", i, err)
		}
	}
	if len(b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrConnInfo, len(b))
	}
	if err := d.validate(); err != nil {
		return err
	}
	*c = d
	return nil
}
