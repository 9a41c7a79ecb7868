package plane

import "github.com/tensorcast/tensorcast/xfer"

// ErrRDMARequired: rdma = on and the RDMA device cannot be used; the plane
// is not built. It matches xfer.ErrNotSupported: the host cannot do what
// the config requires, a start-up error. The plane's other errors wrap
// package peer's sentinels.
var ErrRDMARequired = xfer.Categorized(xfer.ErrNotSupported, "peer plane: rdma = on and RDMA is unusable")
