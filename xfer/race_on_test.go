//go:build race

package xfer_test

// raceEnabled trims the largest copy sizes from tests whose cost the race
// detector multiplies.
const raceEnabled = true
