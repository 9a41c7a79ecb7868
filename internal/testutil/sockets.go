package testutil

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// tcpStates names the st column of /proc/net/tcp.
var tcpStates = map[string]string{
	"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
	"05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
	"09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
}

// DescribeSocket says what the socket "socket:[inode]" is, from the
// kernel's tables in /proc/net: its family, addresses and state, so that a
// leak report tells a peer connection from a metrics scrape or a control
// client. It returns "" when no table lists the inode.
func DescribeSocket(target string) string {
	ino, ok := strings.CutPrefix(target, "socket:[")
	if !ok {
		return ""
	}
	ino = strings.TrimSuffix(ino, "]")
	for _, tab := range []struct {
		name  string
		inode int // column of the inode
	}{
		{"tcp", 9}, {"tcp6", 9}, {"udp", 9}, {"udp6", 9},
		{"unix", 6}, {"netlink", 9}, {"packet", 8}, {"raw", 9}, {"raw6", 9},
	} {
		if d := scanNetTable(tab.name, tab.inode, ino); d != "" {
			return d
		}
	}
	return ""
}

func scanNetTable(name string, col int, ino string) string {
	f, err := os.Open("/proc/self/net/" + name)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) <= col || fs[col] != ino {
			continue
		}
		switch name {
		case "tcp", "tcp6", "udp", "udp6":
			st := fs[3]
			if name[:3] == "tcp" && tcpStates[st] != "" {
				st = tcpStates[st]
			}
			return fmt.Sprintf("%s %s -> %s %s", name, procAddr(fs[1]), procAddr(fs[2]), st)
		case "unix":
			path := ""
			if len(fs) > 7 {
				path = " " + fs[7]
			}
			return fmt.Sprintf("unix type %s state %s%s", fs[4], fs[5], path)
		default:
			return name + " " + strings.Join(fs[:min(len(fs), 4)], " ")
		}
	}
	return ""
}

// procAddr turns /proc/net/tcp's "0100007F:1F90" into "127.0.0.1:8080".
// The address is in the kernel's byte order, 32-bit words at a time.
func procAddr(s string) string {
	h, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	b, err2 := hex.DecodeString(h)
	if !ok || err != nil || err2 != nil || (len(b) != 4 && len(b) != 16) {
		return s
	}
	for i := 0; i+4 <= len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(a.Unmap(), uint16(port)).String()
}
