//go:build race

package link

// raceEnabled: sync.Pool drops items at random under the race detector
// (the tcp node's pools among them), so allocation counts are only exact
// without it.
const raceEnabled = true
