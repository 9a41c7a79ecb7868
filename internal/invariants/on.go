//go:build invariants

package invariants

// Enabled turns on the consistency checks (go test -tags invariants); a
// failed check panics with what it saw, since it means the checked state is
// corrupt.
const Enabled = true
