package rdma

import (
	"errors"
	"net/netip"
	"testing"
)

func fixtureTable(t *testing.T) []GIDEntry {
	t.Helper()
	table, err := ReadGIDTable("testdata/sysfs", "mlx5_0", 1)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

func TestReadGIDTable(t *testing.T) {
	table := fixtureTable(t)
	// Entries 6 (all zero) and 7 (no type: not in use) are left out.
	if len(table) != 6 {
		t.Fatalf("read %d entries, want 6: %+v", len(table), table)
	}
	for i, e := range table {
		if e.Index != i {
			t.Errorf("entry %d has index %d", i, e.Index)
		}
	}
	if e := table[3]; e.Type != "RoCE v2" || e.Netdev != "eth1" || e.GID.String() != "::ffff:192.168.1.5" {
		t.Errorf("entry 3 = %+v (%s)", e, e.GID)
	}
	if _, err := ReadGIDTable("testdata/sysfs", "nosuch0", 1); !errors.Is(err, ErrNoDevice) {
		t.Errorf("missing device: err = %v, want ErrNoDevice", err)
	}
}

func TestSelectGID(t *testing.T) {
	table := fixtureTable(t)
	a := netip.MustParseAddr
	cases := []struct {
		name     string
		netdev   string
		addrs    []netip.Addr
		override int
		want     int // -1: ErrNoGID
	}{
		{"netdev address", "eth1", []netip.Addr{a("192.168.1.5")}, -1, 3},
		{"second address", "eth1", []netip.Addr{a("192.168.2.7")}, -1, 5},
		{"vlan netdev", "eth1.100", []netip.Addr{a("172.16.0.9")}, -1, 4},
		{"address on another netdev", "eth1", []netip.Addr{a("172.16.0.9")}, -1, -1},
		{"no netdev, no address: first v2 mapped", "", nil, -1, 3},
		{"mapped form of address", "eth1", []netip.Addr{a("::ffff:192.168.2.7")}, -1, 5},
		{"unknown address", "eth1", []netip.Addr{a("10.9.9.9")}, -1, -1},
		{"override", "eth1", nil, 2, 2},
		{"override unused", "eth1", nil, 7, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, err := SelectGID(table, c.netdev, c.addrs, c.override)
			if c.want < 0 {
				if !errors.Is(err, ErrNoGID) {
					t.Fatalf("got %+v, %v; want ErrNoGID", e, err)
				}
				return
			}
			if err != nil || e.Index != c.want {
				t.Fatalf("got index %d, %v; want %d", e.Index, err, c.want)
			}
		})
	}
}

func TestParseGID(t *testing.T) {
	g, err := ParseGID("0000:0000:0000:0000:0000:ffff:0a00:020f\n")
	if err != nil || g.String() != "::ffff:10.0.2.15" {
		t.Fatalf("ParseGID = %s, %v", g, err)
	}
	if _, err := ParseGID("zz::1::"); !errors.Is(err, ErrNoGID) {
		t.Errorf("bad gid: err = %v", err)
	}
}

func TestResolveGIDSpec(t *testing.T) {
	table := fixtureTable(t)
	for spec, want := range map[string]int{"": -1, "4": 4, "192.168.2.7": 5, "::ffff:192.168.1.5": 3, " 0 ": 0} {
		got, err := ResolveGIDSpec(table, spec)
		if err != nil || got != want {
			t.Errorf("ResolveGIDSpec(%q) = %d, %v; want %d", spec, got, err, want)
		}
	}
	for _, spec := range []string{"-2", "10.1.1.1", "fe80::zz"} {
		if _, err := ResolveGIDSpec(table, spec); !errors.Is(err, ErrNoGID) {
			t.Errorf("ResolveGIDSpec(%q): err = %v, want ErrNoGID", spec, err)
		}
	}
}
