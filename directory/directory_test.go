package directory

import (
	"errors"
	"strings"
	"sync"
	"testing"
)

func TestEmbedded(t *testing.T) {
	d, err := NewEmbedded(Peer{ID: "a", Addr: "127.0.0.1:1", Epoch: 7}, []Peer{{ID: "b", Addr: "127.0.0.1:2"}})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := d.Lookup("a"); !ok || !p.Self || p.Epoch != 7 {
		t.Fatalf("self = %+v %v", p, ok)
	}
	if p, ok := d.Lookup("b"); !ok || p.Self || p.Addr != "127.0.0.1:2" || p.Epoch != 0 {
		t.Fatalf("b = %+v %v", p, ok)
	}
	if _, ok := d.Lookup("c"); ok {
		t.Fatal("c found")
	}
	if err := d.Update(Peer{ID: "b", Epoch: 9}); err != nil {
		t.Fatal(err)
	}
	if p, _ := d.Lookup("b"); p.Addr != "127.0.0.1:2" || p.Epoch != 9 {
		t.Fatalf("b after epoch update = %+v", p)
	}
	if err := d.Update(Peer{ID: "c"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("new peer without address: %v", err)
	}
	if err := d.Update(Peer{ID: "c", Addr: "127.0.0.1:3"}); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(Peer{ID: "a", Addr: "127.0.0.1:9"}); !errors.Is(err, ErrSelf) {
		t.Fatalf("moving self: %v", err)
	}
	if err := d.Remove("a"); !errors.Is(err, ErrSelf) {
		t.Fatalf("removing self: %v", err)
	}
	if err := d.Remove("zz"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removing unknown: %v", err)
	}
	l := d.List()
	var ids []string
	for _, p := range l {
		ids = append(ids, p.ID)
	}
	if strings.Join(ids, ",") != "a,b,c" {
		t.Fatalf("list = %v", ids)
	}
	if err := d.Remove("c"); err != nil {
		t.Fatal(err)
	}
	if len(d.List()) != 2 {
		t.Fatal("c not removed")
	}
}

func TestEmbeddedInvalid(t *testing.T) {
	cases := []struct {
		name  string
		self  Peer
		peers []Peer
	}{
		{"empty self", Peer{}, nil},
		{"long id", Peer{ID: strings.Repeat("x", MaxIDLen+1)}, nil},
		{"duplicate", Peer{ID: "a"}, []Peer{{ID: "b", Addr: "x:1"}, {ID: "b", Addr: "x:2"}}},
		{"peer equals self", Peer{ID: "a"}, []Peer{{ID: "a", Addr: "x:1"}}},
	}
	for _, c := range cases {
		if _, err := NewEmbedded(c.self, c.peers); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", c.name, err)
		}
	}
}

// TestEmbeddedPeerWithoutAddress: a configured peer may have no address
// yet; it is listed, and the first Update with an address gives it one.
func TestEmbeddedPeerWithoutAddress(t *testing.T) {
	d, err := NewEmbedded(Peer{ID: "a", Addr: "127.0.0.1:1"}, []Peer{{ID: "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := d.Lookup("b"); !ok || p.Addr != "" {
		t.Fatalf("b = %+v, %v; want it listed without an address", p, ok)
	}
	if err := d.Update(Peer{ID: "b", Epoch: 3}); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(Peer{ID: "b", Addr: "127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	if p, _ := d.Lookup("b"); p.Addr != "127.0.0.1:2" || p.Epoch != 3 {
		t.Fatalf("b after updates = %+v", p)
	}
}

func TestEmbeddedConcurrent(t *testing.T) {
	d, err := NewEmbedded(Peer{ID: "a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				_ = d.Update(Peer{ID: "p", Addr: "x:1", Epoch: uint64(i*1000 + j + 1)})
				d.Lookup("p")
				d.List()
			}
		}(i)
	}
	wg.Wait()
	if p, ok := d.Lookup("p"); !ok || p.Epoch == 0 {
		t.Fatalf("p = %+v", p)
	}
}
