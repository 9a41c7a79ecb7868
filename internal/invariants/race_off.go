//go:build !race

package invariants

// RaceEnabled is off without -race; see race_on.go.
const RaceEnabled = false
