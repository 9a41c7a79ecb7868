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
// # Client buffers and seals
//
// A client registers memory by passing an fd (SCM_RIGHTS); MapBuffer maps
// it. Only memory is taken: a memfd, or a file on tmpfs or hugetlbfs (such
// as an unlinked /dev/shm file); a file on a disk file system, a pipe, a
// socket or a device is refused. What keeps the daemon's mapping from
// vanishing is the file's F_SEAL_SHRINK seal, and a buffer is registered
// under one of three regimes (Sealing), each logged at registration:
//
//   - SealedByClient: the memfd came sealed against shrinking (what
//     tc_buffer_create and the Go client make).
//   - SealedByDaemon: the memfd was made with MFD_ALLOW_SEALING but not
//     sealed; MapBuffer adds F_SEAL_SHRINK itself, before it checks the
//     size, so the client's later shrink fails with EPERM in the client
//     and costs nothing else. Growing it stays allowed. A seal cannot be
//     removed: it outlives the registration.
//   - Unsealed: the file cannot be sealed (F_SEAL_SEAL is set: a memfd made
//     without MFD_ALLOW_SEALING, as engines' shared-memory host allocators
//     make them, or any tmpfs file that is not a memfd). Its owner can
//     shrink it under any transfer, and then every byte the daemon touches
//     past the new end faults (SIGBUS).
//
// An Unsealed buffer is accepted on these terms (it is xfer.Shrinkable):
//
//   - Every copy the daemon makes in Go to or from it goes through
//     internal/faultcopy, with runtime/debug.SetPanicOnFault on: the local
//     transport's copies, the store's copying put and get, and the records
//     a queue's store call writes. A fault ends that request with a
//     FAILED_PRECONDITION error (xfer.ErrFault, store.ErrFault) and counts
//     in tensorcast_memory_faults_total; the goroutine and the daemon go
//     on.
//   - The kernel touches it for io_uring (file reads and writes, which
//     end that request with EFAULT, FAILED_PRECONDITION too) and for RDMA
//     (the memory registration pins the pages, or fails with EFAULT). A
//     registration made before a shrink keeps the old pages: once the
//     client grows the file again, RDMA moves bytes of pages the client no
//     longer sees, to and from where the client itself addressed them (no
//     other client's memory), until it registers the buffer again.
//   - It is refused (xfer.ErrUnsealed) where a fault could not be kept to
//     one request: as the local side of a TCP transfer (its payload goes
//     through a stream other requests share) and as an export to peers.
//     So it moves to and from peers by RDMA only: a request that would go
//     to TCP (on a host without RDMA, or to a remote segment opened with
//     transport auto before the buffer's registration and the link are
//     up) fails; one to a remote segment opened with transport rdma waits
//     for the registration.
//
// A new path that touches client buffers must do one of the three.
//
// # Pages
//
// The pool is on 2 MiB pages: hugetlb pages when reserved, else
// transparent ones placed by MADV_COLLAPSE at start (NewPool). The buffers
// the clients make (the Go client's RegisterBuffer, libtensorcast's
// tc_buffer_create, and so Python's create_buffer) are placed the same way
// by the client before it registers them (Collapse), and MapBuffer maps
// every buffer on a 2 MiB boundary: the kernel then maps their 2 MiB
// pages with one entry each in the daemon as well, and the daemon's copies
// into and out of them (tcp's reads and writes, the local transport, a
// disk's DMA) walk one entry per 2 MiB instead of 512. Such a buffer's
// memory is resident from its creation, as the pool's is. A buffer made
// elsewhere (an engine's own memfd) keeps the pages its maker gave it.
//
// Raw syscalls live in sys_linux.go; on other systems every constructor
// returns an error matching [ErrNotSupported].
package shm
