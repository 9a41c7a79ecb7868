package grant

import (
	"context"
	"fmt"
	"testing"

	"github.com/tensorcast/tensorcast/directory"
)

// agedDir is a directory whose cached entries are past their staleness
// budget: Lookup still answers the last epoch it knew, ResolveMember
// answers what a confirmation found (err when none could be had).
type agedDir struct {
	*directory.Embedded
	resolved directory.MemberView
	err      error
	lanes    []directory.Lane
}

func (d *agedDir) ResolveMember(_ context.Context, lane directory.Lane, _ string) (directory.MemberView, error) {
	d.lanes = append(d.lanes, lane)
	return d.resolved, d.err
}

// TestDirectoryMembersFailClosedPastBudget: a member the directory cannot
// confirm within its budget is not known for certain, though its cache
// still holds an epoch for it; one it confirms is known by the epoch the
// confirmation found, not the cache's older one.
func TestDirectoryMembersFailClosedPastBudget(t *testing.T) {
	emb, err := directory.NewEmbedded(directory.Peer{ID: "self"}, []directory.Peer{{ID: "issuer", Addr: "127.0.0.1:1", Epoch: 7}})
	if err != nil {
		t.Fatal(err)
	}
	d := &agedDir{Embedded: emb, err: fmt.Errorf("%w: the store did not answer", directory.ErrUnavailable)}
	m := DirectoryMembers{Dir: d}
	if ep, ok := m.Epoch("issuer"); ok {
		t.Fatalf("Epoch of a member the directory could not confirm = %#x, true; want not known", ep)
	}
	d.err, d.resolved = nil, directory.MemberView{Member: directory.Member{ID: "issuer", Epoch: 9}}
	if ep, ok := m.Epoch("issuer"); !ok || ep != 9 {
		t.Fatalf("Epoch of a confirmed member = %#x, %v; want 0x9, true", ep, ok)
	}
	for _, l := range d.lanes {
		if l != directory.LaneCatalogFirst {
			t.Fatalf("asked in lane %v, want catalog-first (a store read past the budget)", l)
		}
	}
	// A directory without ages (the embedded one) answers from the
	// handshakes it recorded.
	if ep, ok := (DirectoryMembers{Dir: emb}).Epoch("issuer"); !ok || ep != 7 {
		t.Fatalf("embedded Epoch = %#x, %v; want 0x7, true", ep, ok)
	}
}
