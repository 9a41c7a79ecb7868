//go:build !nometers

package xfer

// metersOn: the engine meters every transport (meter.go). Building with
// -tags nometers turns them off, only to measure what they cost
// (scripts/bench-metrics-cost.sh); TransportStats then reports zeros.
const metersOn = true
