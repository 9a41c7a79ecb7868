//go:build race

package invariants

// RaceEnabled reports a build with the race detector (-race).
const RaceEnabled = true
