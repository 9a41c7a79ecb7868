//go:build !linux

package client

// sharedMemory is false: without memfds the client can talk to a daemon
// (Dial with NoPool, Ping, Stats, the batch calls) but not map
// its pool or register buffers of its own; those return ErrNotSupported.
const sharedMemory = false

// peerGone: queues need Linux, so nothing waits on one here.
func (c *Client) peerGone() bool { return false }
