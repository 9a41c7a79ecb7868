// Package invariants holds the build's two switches that code and tests
// read as constants, instead of an on/off file pair in every package.
//
// Enabled, on with -tags invariants, turns on the internal consistency
// checks, which panic with what they saw when broken, since the checked
// state is then corrupt: the engine's task states and counters (xfer), the
// rings' indices and slots (queue, uring), the pool allocator's slabs (shm)
// and the store's lists, counts, pins and task ownership (store).
//
// RaceEnabled, on under -race, tells tests that sync.Pool drops items at
// random and that every memory access costs more: allocation counts are
// not exact and the largest sizes are trimmed.
//
// Being constants, a check behind `if invariants.Enabled` costs nothing in
// a normal build: the compiler drops it.
package invariants
