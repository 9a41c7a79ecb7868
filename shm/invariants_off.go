//go:build !invariants

package shm

// invariants is off in normal builds; see invariants_on.go.
const invariants = false
