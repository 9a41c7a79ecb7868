// Package shm is tensorcast's shared memory: the daemon's DRAM pool (one
// memfd that the daemon maps and hands to every client, which maps it too),
// the pool's block allocator, and the buffers clients register by passing
// their own memfd.
//
// The pool is a [xfer.MemSegment] of kind [xfer.KindPool]; a registered
// client buffer is one of kind [xfer.KindClient]. Both count references:
// Close stops new Acquires and the mapping is unmapped exactly once, when the
// last reference held by a transfer is released.
//
// The allocator hands out power-of-two blocks from MinBlock to MaxBlock. The
// pool is cut into slabs of MaxBlock bytes that are given to a size class on
// demand and returned to the free slab list when their last block is freed.
// Alloc and Free are O(1), allocate no memory, and keep all metadata outside
// the shared mapping, so a client that scribbles over the pool cannot corrupt
// the allocator.
//
// Raw syscalls live in sys_linux.go; on other systems every constructor
// returns an error matching [ErrNotSupported].
package shm
