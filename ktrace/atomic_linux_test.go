package ktrace

import "sync/atomic"

// Ring indices shared with the kernel are read and written with sync/atomic.
func loadAcquire(p *uint32) uint32     { return atomic.LoadUint32(p) }
func storeRelease(p *uint32, v uint32) { atomic.StoreUint32(p, v) }
