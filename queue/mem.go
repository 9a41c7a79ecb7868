package queue

import (
	"errors"
	"fmt"

	"github.com/tensorcast/tensorcast/shm"
)

// Create makes a new queue of geometry g: a sealed memfd (it cannot be
// shrunk or grown under either side) mapped shared here and laid out. It
// returns the daemon's side and the memfd to pass to the client; the
// caller closes the fd once it is passed. Release unmaps.
func Create(id uint64, g Geometry) (*DaemonRing, int, error) {
	fd, err := shm.NewMemfd(fmt.Sprintf("tensorcast-queue-%d", id), g.Size, true)
	if err != nil {
		return nil, -1, err
	}
	mem, err := shm.MapShared(fd, g.Size)
	if err != nil {
		return nil, -1, errors.Join(err, closeFD(fd))
	}
	return NewDaemonRing(mem, g, id), fd, nil
}

// Release unmaps the daemon's mapping of the queue. The owner calls it once
// nothing can Post any more (every request taken has its CQE).
func (r *DaemonRing) Release() error {
	if r.mem == nil {
		return nil
	}
	err := shm.Unmap(r.mem[:cap(r.mem)])
	r.mem = nil
	return errors.Join(err, r.CloseDoorbell())
}

// CloseDoorbell closes the queue's eventfd doorbell (UseEventfd), once no
// worker waits on it (after the queue's Detach); Release does it too.
// EventfdDoorbell reports none afterwards.
func (r *DaemonRing) CloseDoorbell() error {
	if r.efd < 0 {
		return nil
	}
	err := closeFD(r.efd)
	r.efd = -1
	return err
}

// Map maps a queue's memfd of size bytes (as OpenQueue reported it) and
// takes the client's side. The caller may close fd afterwards; Unmap
// releases the mapping.
func Map(fd int, size uint64) (*ClientRing, error) {
	if size < headerSize || size > 1<<32 {
		return nil, fmt.Errorf("%w: queue of %d bytes", ErrGeometry, size)
	}
	mem, err := shm.MapShared(fd, size)
	if err != nil {
		return nil, err
	}
	q, err := NewClientRing(mem)
	if err != nil {
		return nil, errors.Join(err, shm.Unmap(mem))
	}
	return q, nil
}

// Unmap releases the client's mapping. The ring is unusable afterwards.
func (q *ClientRing) Unmap() error {
	if q.mem == nil {
		return nil
	}
	err := shm.Unmap(q.mem[:cap(q.mem)])
	q.mem = nil
	if q.efd >= 0 {
		err = errors.Join(err, closeFD(q.efd))
		q.efd = -1
	}
	return err
}
