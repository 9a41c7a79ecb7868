//go:build !linux

package queue

import "os"

func closeFD(fd int) error { return os.NewFile(uintptr(fd), "queue").Close() }
