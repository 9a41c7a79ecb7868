//go:build !invariants

package xfer

// invariants enables the engine's internal consistency checks (legal state
// transitions, counters never below zero). Build with -tags invariants to
// turn them into panics.
const invariants = false
