//go:build linux

package queue

import (
	"os"

	"golang.org/x/sys/unix"
)

func closeFD(fd int) error { return os.NewSyscallError("close", unix.Close(fd)) }
