package rdma

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// PortInfo is what sysfs says about one port of an RDMA device.
type PortInfo struct {
	Port int
	// State is the logical state without its number: "ACTIVE", "DOWN".
	State string
	// LinkLayer is "Ethernet" (RoCE) or "InfiniBand".
	LinkLayer string
	// Netdevs are the network devices its GID table names.
	Netdevs []string
}

// Active reports whether the port can carry traffic.
func (p PortInfo) Active() bool { return p.State == "ACTIVE" }

// DeviceInfo is one RDMA device and its ports.
type DeviceInfo struct {
	Name  string
	Ports []PortInfo
}

// ListDevices lists the RDMA devices the kernel has (found with rdmamap),
// with their ports read from sysfs. A host without RDMA gives none.
func ListDevices() []DeviceInfo {
	var out []DeviceInfo
	for _, name := range rdmamap.GetRdmaDeviceList() {
		d := DeviceInfo{Name: name}
		for _, p := range rdmamap.GetPorts(name) {
			n, err := strconv.Atoi(p)
			if err != nil {
				continue
			}
			d.Ports = append(d.Ports, ReadPort(SysfsRoot, name, n))
		}
		sort.Slice(d.Ports, func(i, j int) bool { return d.Ports[i].Port < d.Ports[j].Port })
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ReadPort reads one port's state, link layer and netdevs from the sysfs
// tree under root.
func ReadPort(root, dev string, port int) PortInfo {
	dir := filepath.Join(root, "class", "infiniband", dev, "ports", strconv.Itoa(port))
	p := PortInfo{Port: port}
	if b, err := os.ReadFile(filepath.Join(dir, "state")); err == nil {
		// "4: ACTIVE"
		s := strings.TrimSpace(string(b))
		if i := strings.IndexByte(s, ':'); i >= 0 {
			s = strings.TrimSpace(s[i+1:])
		}
		p.State = s
	}
	if b, err := os.ReadFile(filepath.Join(dir, "link_layer")); err == nil {
		p.LinkLayer = strings.TrimSpace(string(b))
	}
	seen := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(dir, "gid_attrs", "ndevs"))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, "gid_attrs", "ndevs", e.Name()))
		if nd := strings.TrimSpace(string(b)); err == nil && nd != "" && !seen[nd] {
			seen[nd] = true
			p.Netdevs = append(p.Netdevs, nd)
		}
	}
	sort.Strings(p.Netdevs)
	return p
}

// FirstActive is the first device (by name) with an active port: its name
// and port number, or false.
func FirstActive(devs []DeviceInfo) (string, int, bool) {
	for _, d := range devs {
		for _, p := range d.Ports {
			if p.Active() {
				return d.Name, p.Port, true
			}
		}
	}
	return "", 0, false
}
