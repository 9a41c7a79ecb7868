//go:build !invariants

package invariants

// Enabled is off in normal builds; see on.go.
const Enabled = false
