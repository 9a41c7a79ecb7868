//go:build race

package xfer

// raceEnabled trims the largest copy sizes from tests whose cost the race
// detector multiplies.
const raceEnabled = true
