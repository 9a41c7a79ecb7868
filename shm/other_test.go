//go:build !linux

package shm

import (
	"errors"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

func TestNotSupportedOffLinux(t *testing.T) {
	if _, err := NewPool(PoolConfig{ID: 1, Size: 4 << 20}, nil); !errors.Is(err, xfer.ErrNotSupported) {
		t.Errorf("NewPool = %v, want ErrNotSupported", err)
	}
	if _, err := NewMemfd("x", 4096, true); !errors.Is(err, ErrNotSupported) {
		t.Errorf("NewMemfd = %v, want ErrNotSupported", err)
	}
	if _, err := MapShared(0, 4096); !errors.Is(err, ErrNotSupported) {
		t.Errorf("MapShared = %v, want ErrNotSupported", err)
	}
}
