//go:build !linux

package queue

import "os"

func closeFD(fd int) error { return os.NewFile(uintptr(fd), "queue").Close() }

func newEventfd() (int, error) { return -1, ErrNotSupported }

func dupFD(int) (int, error) { return -1, ErrNotSupported }

func ringEventfd(int) {}
