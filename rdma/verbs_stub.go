//go:build !linux || !cgo

package rdma

import (
	"fmt"
	"log/slog"

	"github.com/tensorcast/tensorcast/xfer"
)

// errNoCgo is what every verbs entry point returns in a build without cgo
// (or off Linux): RDMA is absent and the daemon uses tcp.
var errNoCgo = fmt.Errorf("rdma: built without cgo or not on linux: %w", xfer.ErrNotSupported)

// Device is an opened RDMA device; this build cannot open one.
type Device struct{}

// Open fails: this build has no verbs.
func Open(Config, *slog.Logger) (*Device, error) { return nil, errNoCgo }

// Name is "".
func (*Device) Name() string { return "" }

// Port is 0.
func (*Device) Port() int { return 0 }

// Addr is the zero Addr.
func (*Device) Addr() Addr { return Addr{} }

// Register fails: this build has no verbs.
func (*Device) Register([]byte) (*Region, error) { return nil, errNoCgo }

// RegisterAccess fails: this build has no verbs.
func (*Device) RegisterAccess([]byte, Access) (*Region, error) { return nil, errNoCgo }

// Deregister fails: this build has no verbs.
func (*Device) Deregister(*Region) error { return errNoCgo }

// NewTransport fails: this build has no verbs.
func (*Device) NewTransport() (*Transport, error) { return nil, errNoCgo }

// Close does nothing.
func (*Device) Close() error { return nil }
