//go:build !invariants

package queue

// invariants enables the rings' internal consistency checks. Build with
// -tags invariants to turn them into panics.
const invariants = false
