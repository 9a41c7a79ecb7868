package rdma

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// GID is a port's global identifier (an IPv6 address in form; RoCE v2 uses
// the IPv4-mapped address of the netdev).
type GID [16]byte

// String is the address form of the GID ("::ffff:10.0.2.15").
func (g GID) String() string { return netip.AddrFrom16(g).String() }

// IsZero reports whether g is the all-zero (unused) entry.
func (g GID) IsZero() bool { return g == GID{} }

// ParseGID parses sysfs's form ("0000:0000:0000:0000:0000:ffff:0a00:020f")
// or any IPv6/IPv4 address (an IPv4 address becomes IPv4-mapped).
func ParseGID(s string) (GID, error) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return GID{}, fmt.Errorf("%w: gid %q: %v", ErrNoGID, s, err)
	}
	return GID(a.As16()), nil
}

// GIDEntry is one used entry of a port's GID table.
type GIDEntry struct {
	Index int
	GID   GID
	// Type is the kernel's name for it: "RoCE v2", "IB/RoCE v1".
	Type string
	// Netdev is the network device the entry belongs to ("" for IB).
	Netdev string
}

// RoCEv2 reports whether the entry is a RoCE v2 GID.
func (e GIDEntry) RoCEv2() bool { return e.Type == "RoCE v2" }

// IPv4 returns the IPv4 address of an IPv4-mapped GID.
func (e GIDEntry) IPv4() (netip.Addr, bool) {
	a := netip.AddrFrom16(e.GID)
	if !a.Is4In6() {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// SysfsRoot is where the kernel's sysfs is mounted.
const SysfsRoot = "/sys"

// ReadGIDTable reads the used entries of port's GID table of device dev
// from the sysfs tree under root (SysfsRoot, or a fixture in tests):
// class/infiniband/DEV/ports/N/gids/* with gid_attrs/types/* and
// gid_attrs/ndevs/*. Unused entries (all zero, or whose attributes the
// kernel refuses to read) are left out. Entries come sorted by index.
func ReadGIDTable(root, dev string, port int) ([]GIDEntry, error) {
	pdir := filepath.Join(root, "class", "infiniband", dev, "ports", strconv.Itoa(port))
	names, err := os.ReadDir(filepath.Join(pdir, "gids"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s port %d", ErrNoDevice, dev, port)
		}
		return nil, err
	}
	var out []GIDEntry
	for _, n := range names {
		idx, err := strconv.Atoi(n.Name())
		if err != nil || idx < 0 {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(pdir, "gids", n.Name()))
		if err != nil {
			continue
		}
		g, err := ParseGID(string(raw))
		if err != nil || g.IsZero() {
			continue
		}
		typ, err := os.ReadFile(filepath.Join(pdir, "gid_attrs", "types", n.Name()))
		if err != nil {
			continue // the kernel answers EINVAL for entries not in use
		}
		ndev, _ := os.ReadFile(filepath.Join(pdir, "gid_attrs", "ndevs", n.Name()))
		out = append(out, GIDEntry{
			Index:  idx,
			GID:    g,
			Type:   strings.TrimSpace(string(typ)),
			Netdev: strings.TrimSpace(string(ndev)),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// SelectGID picks the GID a RoCE v2 queue pair should use from a port's
// table. With override >= 0 that index is used, provided it is a used
// entry. Otherwise the choice is the lowest-index RoCE v2 entry whose GID is
// IPv4-mapped, belongs to netdev (when netdev is not "") and whose address
// is one of addrs (when addrs is not empty).
func SelectGID(table []GIDEntry, netdev string, addrs []netip.Addr, override int) (GIDEntry, error) {
	if override >= 0 {
		for _, e := range table {
			if e.Index == override {
				return e, nil
			}
		}
		return GIDEntry{}, fmt.Errorf("%w: configured gid index %d is not in use", ErrNoGID, override)
	}
	for _, e := range table {
		if !e.RoCEv2() || (netdev != "" && e.Netdev != netdev) {
			continue
		}
		ip, ok := e.IPv4()
		if !ok {
			continue
		}
		if len(addrs) == 0 {
			return e, nil
		}
		for _, a := range addrs {
			if a.Unmap() == ip {
				return e, nil
			}
		}
	}
	return GIDEntry{}, fmt.Errorf("%w: no IPv4-mapped RoCE v2 entry for netdev %q addresses %v", ErrNoGID, netdev, addrs)
}

// NetdevAddrs lists the IPv4 addresses of a network device.
func NetdevAddrs(netdev string) ([]netip.Addr, error) {
	ifc, err := net.InterfaceByName(netdev)
	if err != nil {
		return nil, err
	}
	as, err := ifc.Addrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// ResolveGIDSpec turns a configured GID override into a table index: ""
// is -1 (automatic), a number is that index, an address is the index of
// the RoCE v2 entry carrying it.
func ResolveGIDSpec(table []GIDEntry, spec string) (int, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return -1, nil
	}
	if i, err := strconv.Atoi(spec); err == nil {
		if i < 0 {
			return 0, fmt.Errorf("%w: gid index %d", ErrNoGID, i)
		}
		return i, nil
	}
	g, err := ParseGID(spec)
	if err != nil {
		return 0, err
	}
	for _, e := range table {
		if e.GID == g && e.RoCEv2() {
			return e.Index, nil
		}
	}
	return 0, fmt.Errorf("%w: no RoCE v2 entry carries %s", ErrNoGID, g)
}

// ChooseGID reads the live GID table of dev/port and selects the RoCE v2
// GID matching the port's netdev address (see SelectGID), or the one spec
// names (see ResolveGIDSpec). netdev "" means any netdev.
func ChooseGID(dev string, port int, netdev, spec string) (GIDEntry, error) {
	table, err := ReadGIDTable(SysfsRoot, dev, port)
	if err != nil {
		return GIDEntry{}, err
	}
	override, err := ResolveGIDSpec(table, spec)
	if err != nil {
		return GIDEntry{}, err
	}
	var addrs []netip.Addr
	if netdev != "" {
		if addrs, err = NetdevAddrs(netdev); err != nil {
			return GIDEntry{}, fmt.Errorf("%w: netdev %s: %v", ErrNoGID, netdev, err)
		}
	}
	return SelectGID(table, netdev, addrs, override)
}
