//go:build linux

package uring

// Raw io_uring ABI: the structures the kernel shares with us and the three
// system calls. Nothing here knows about tasks or segments.

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Setup flags (io_uring_params.flags).
const (
	setupIOPoll        = 1 << 0
	setupSQPoll        = 1 << 1
	setupCQSize        = 1 << 3
	setupClamp         = 1 << 4
	setupRDisabled     = 1 << 6
	setupSubmitAll     = 1 << 7
	setupCoopTaskrun   = 1 << 8
	setupTaskrunFlag   = 1 << 9
	setupSingleIssuer  = 1 << 12
	setupDeferTaskrun  = 1 << 13
	setupNoSQArray     = 1 << 16
	featSingleMmap     = 1 << 0
	featNoDrop         = 1 << 1
	featSubmitStable   = 1 << 2
	featFastPoll       = 1 << 5
	featExtArg         = 1 << 8
	featNativeWorkers  = 1 << 9
	featRsrcTags       = 1 << 10
	enterGetEvents     = 1 << 0
	enterSQWakeup      = 1 << 1
	enterExtArg        = 1 << 3
	sqNeedWakeup       = 1 << 0
	sqCQOverflow       = 1 << 1
	sqTaskrun          = 1 << 2
	sqeFixedFile       = 1 << 0
	asyncCancelAll     = 1 << 0
	asyncCancelAny     = 1 << 2
	rsrcRegisterSparse = 1 << 0
	probeOpSupported   = 1 << 0

	// futex2 flags of IORING_OP_FUTEX_WAIT (in the SQE's fd): a 32-bit
	// word, shared (no FUTEX2_PRIVATE); and the bitset a FUTEX_WAKE of
	// futex(2) matches.
	futex2SizeU32       = 0x02
	futexBitsetMatchAny = 0xffffffff
)

// Opcodes this package uses (the probe reports all of them).
const (
	opNop         = 0
	opReadFixed   = 4
	opWriteFixed  = 5
	opPollAdd     = 6
	opAsyncCancel = 14
	opRead        = 22
	opWrite       = 23
	opFutexWait   = 51
	opLastKnown   = 63
)

// io_uring_register opcodes.
const (
	regProbe          = 8
	regFiles2         = 13
	regFilesUpdate2   = 14
	regBuffers2       = 15
	regBuffersUpdate  = 16
	regUnregisterBufs = 1
)

// mmap offsets of the three shared regions.
const (
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// sqe is struct io_uring_sqe (64 bytes).
type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	opFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	fileIndex   int32
	addr3       uint64
	pad         uint64
}

// CQE is struct io_uring_cqe: the request's user data, its result (bytes or
// a negative errno) and flags.
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

type rsrcRegister struct {
	nr    uint32
	flags uint32
	resv2 uint64
	data  uint64
	tags  uint64
}

type rsrcUpdate2 struct {
	offset uint32
	resv   uint32
	data   uint64
	tags   uint64
	nr     uint32
	resv2  uint32
}

type getEventsArg struct {
	sigmask     uint64
	sigmaskSize uint32
	minWaitUsec uint32
	ts          uint64
}

type probeHeader struct {
	lastOp  uint8
	opsLen  uint8
	resv    uint16
	resv2   [3]uint32
	opsFlat [opLastKnown + 1]probeOp
}

type probeOp struct {
	op    uint8
	resv  uint8
	flags uint16
	resv2 uint32
}

// Compile-time checks of the ABI sizes: a layout mistake here would corrupt
// memory shared with the kernel, so the package must not build with one.
var (
	_ = [1]struct{}{}[unsafe.Sizeof(sqe{})-64]
	_ = [1]struct{}{}[unsafe.Sizeof(CQE{})-16]
	_ = [1]struct{}{}[unsafe.Sizeof(params{})-120]
	_ = [1]struct{}{}[unsafe.Sizeof(rsrcRegister{})-32]
	_ = [1]struct{}{}[unsafe.Sizeof(rsrcUpdate2{})-32]
	_ = [1]struct{}{}[unsafe.Sizeof(getEventsArg{})-24]
)

func sysSetup(entries uint32, p *params) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	if errno != 0 {
		return -1, os.NewSyscallError("io_uring_setup", errno)
	}
	return int(fd), nil
}

// sysEnter is io_uring_enter; it returns the raw errno so the poller can
// tell EINTR/EAGAIN/EBUSY from real failures without allocating.
func sysEnter(fd int, toSubmit, minComplete, flags uint32, arg unsafe.Pointer, argSize uintptr) (int, unix.Errno) {
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(fd), uintptr(toSubmit), uintptr(minComplete),
		uintptr(flags), uintptr(arg), argSize)
	return int(n), errno
}

func sysRegister(fd int, op uint32, arg unsafe.Pointer, nr uint32) error {
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(fd), uintptr(op), uintptr(arg), uintptr(nr), 0, 0)
	if errno != 0 {
		return os.NewSyscallError("io_uring_register", errno)
	}
	return nil
}
