//go:build !linux

package metrics

import "net"

// processFDs: without /proc/self/fd the endpoint is bounded by
// ServerConfig.MaxConns only.
func processFDs(int) (open, limit int, ok bool) { return 0, 0, false }

func connFD(net.Conn) int { return -1 }

// FDLimit: not known here.
func FDLimit() (limit int, ok bool) { return 0, false }
