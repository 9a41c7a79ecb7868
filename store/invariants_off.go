//go:build !invariants

package store

// invariants is off in normal builds; see invariants_on.go.
const invariants = false
