//go:build invariants

package shm

// invariants turns on the allocator's per-operation consistency checks
// (go test -tags invariants); a failed check panics, since it means the
// allocator's own state is corrupt.
const invariants = true
