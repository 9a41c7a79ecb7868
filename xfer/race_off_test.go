//go:build !race

package xfer

const raceEnabled = false
