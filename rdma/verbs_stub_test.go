//go:build !linux || !cgo

package rdma

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

func TestStubNotSupported(t *testing.T) {
	if _, err := Open(Config{}, slog.Default()); !errors.Is(err, xfer.ErrNotSupported) {
		t.Fatalf("Open = %v, want ErrNotSupported", err)
	}
}
