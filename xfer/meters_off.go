//go:build nometers

package xfer

// metersOn is false under -tags nometers: a build for measuring what the
// meters cost (scripts/bench-metrics-cost.sh), never for running.
const metersOn = false
