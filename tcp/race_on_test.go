//go:build race

package tcp

// raceEnabled: sync.Pool drops items at random under the race detector, so
// allocation counts are only exact without it.
const raceEnabled = true
