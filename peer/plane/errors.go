package plane

import "errors"

// ErrRDMARequired: rdma = on and the RDMA device cannot be used; the plane
// is not built. The plane's other errors wrap package peer's sentinels.
var ErrRDMARequired = errors.New("peer plane: rdma = on and RDMA is unusable")
