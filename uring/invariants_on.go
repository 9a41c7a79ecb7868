//go:build invariants

package uring

// invariants turns on the ring-index and slot checks (build with
// -tags invariants); a broken invariant panics with what it saw.
const invariants = true
