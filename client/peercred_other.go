//go:build !linux

package client

import (
	"errors"
	"fmt"
)

// DaemonPID needs SO_PEERCRED, which only Linux has.
func (c *Client) DaemonPID() (int, error) {
	return 0, fmt.Errorf("%w: the daemon's pid (SO_PEERCRED) is known on Linux only", errors.ErrUnsupported)
}
