package client

import (
	"slices"

	"github.com/tensorcast/tensorcast/wire"
)

// DirectoryInfo is the daemon's peer directory: the backend ("embedded" or
// "etcd") and its state, the store it reads, the cache's counters and
// age, and the members it knows with their epochs and lease time left.
type DirectoryInfo = wire.DirectoryResponse

// DirectoryMember is one member as the daemon's directory knows it.
type DirectoryMember = wire.DirectoryMember

// DirectoryCache is the daemon's directory cache counters.
type DirectoryCache = wire.DirectoryCache

// AgeNever is the age of what the directory's store never confirmed.
const AgeNever = wire.AgeNever

// Directory reports the daemon's peer directory. With the etcd directory
// the daemon reads its members' lease times from etcd, within a few
// seconds; with etcd down they are not known.
func (c *Client) Directory(opts ...CallOption) (DirectoryInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.DirectoryRequest](c.start(opts))
	r, err := call[wire.DirectoryResponse](c, noFD, nil)
	if err != nil {
		return DirectoryInfo{}, err
	}
	// The decoder copied the strings; its slices are reused by the next
	// answer, so the caller gets copies.
	info := *r
	info.Endpoints = slices.Clone(r.Endpoints)
	info.Members = slices.Clone(r.Members)
	for i := range info.Members {
		info.Members[i].Caps = slices.Clone(r.Members[i].Caps)
	}
	return info, nil
}
