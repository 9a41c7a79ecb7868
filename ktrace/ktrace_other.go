//go:build !linux

package ktrace

// Views are the loaded kernel-side views; on this OS there are none.
type Views struct{}

// Open reports every view as unsupported on this OS.
func Open(want []View, _ Options) (*Views, map[View]error) {
	errs := map[View]error{}
	for _, w := range want {
		errs[w] = ErrNotSupported
	}
	return nil, errs
}

func (v *Views) Has(View) bool             { return false }
func (v *Views) Close() error              { return nil }
func (v *Views) Rings() []Ring             { return nil }
func (v *Views) Retransmits() []Retransmit { return nil }
