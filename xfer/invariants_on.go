//go:build invariants

package xfer

// invariants enables the engine's internal consistency checks (legal state
// transitions, counters never below zero), which panic when broken.
const invariants = true
