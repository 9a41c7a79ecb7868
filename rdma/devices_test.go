package rdma

import (
	"reflect"
	"testing"
)

func TestReadPortFixture(t *testing.T) {
	p := ReadPort("testdata/sysfs", "mlx5_0", 1)
	want := PortInfo{Port: 1, State: "ACTIVE", LinkLayer: "Ethernet", Netdevs: []string{"eth1", "eth1.100"}}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("ReadPort = %+v, want %+v", p, want)
	}
	if q := ReadPort("testdata/sysfs", "mlx5_0", 2); q.Active() || q.State != "" {
		t.Errorf("missing port reads as %+v", q)
	}
}

func TestFirstActive(t *testing.T) {
	devs := []DeviceInfo{
		{Name: "a", Ports: []PortInfo{{Port: 1, State: "DOWN"}}},
		{Name: "b", Ports: []PortInfo{{Port: 1, State: "INIT"}, {Port: 2, State: "ACTIVE"}}},
		{Name: "c", Ports: []PortInfo{{Port: 1, State: "ACTIVE"}}},
	}
	if n, p, ok := FirstActive(devs); !ok || n != "b" || p != 2 {
		t.Errorf("FirstActive = %s %d %v, want b 2", n, p, ok)
	}
	if _, _, ok := FirstActive(devs[:1]); ok {
		t.Error("FirstActive found a port in a list with none active")
	}
}
