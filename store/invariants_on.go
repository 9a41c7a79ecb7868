//go:build invariants

package store

// invariants turns on the store's consistency checks (lists, counts, task
// ownership) with go test -tags invariants; a failed check panics, since it
// means the store's own state is corrupt.
const invariants = true
