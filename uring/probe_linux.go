//go:build linux

package uring

import (
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// probeResult is what the kernel offers, probed once per process.
type probeResult struct {
	err          error
	features     uint32
	ops          [opLastKnown + 1]bool
	lastOp       uint8
	singleIssuer bool // SINGLE_ISSUER accepted
	deferTaskrun bool // SINGLE_ISSUER|DEFER_TASKRUN accepted
	coopTaskrun  bool // COOP_TASKRUN|TASKRUN_FLAG accepted
}

var (
	probeOnce sync.Once
	probed    probeResult
	// probeLog makes the first transport log the probe; later ones log
	// only what they use.
	probeLog sync.Once
)

// probe runs the feature and opcode probe once and caches it.
func probe() *probeResult {
	probeOnce.Do(func() { probed = runProbe() })
	return &probed
}

func tryFlags(flags uint32) bool {
	var p params
	p.flags = flags
	fd, err := sysSetup(4, &p)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

func runProbe() probeResult {
	var res probeResult
	var p params
	fd, err := sysSetup(4, &p)
	if err != nil {
		res.err = err
		return res
	}
	defer unix.Close(fd)
	res.features = p.features
	var pr probeHeader
	if err := sysRegister(fd, regProbe, unsafe.Pointer(&pr), uint32(len(pr.opsFlat))); err == nil {
		res.lastOp = pr.lastOp
		for i := 0; i < int(pr.opsLen) && i < len(pr.opsFlat); i++ {
			op := pr.opsFlat[i]
			if int(op.op) < len(res.ops) && op.flags&probeOpSupported != 0 {
				res.ops[op.op] = true
			}
		}
	} else {
		// Kernels before 5.6 have no probe; the opcodes this package needs
		// are then assumed present and fail per request if not.
		for _, op := range []int{opReadFixed, opWriteFixed, opAsyncCancel, opRead, opWrite} {
			res.ops[op] = true
		}
	}
	res.singleIssuer = tryFlags(setupSingleIssuer)
	res.deferTaskrun = tryFlags(setupSingleIssuer | setupDeferTaskrun)
	res.coopTaskrun = tryFlags(setupCoopTaskrun | setupTaskrunFlag)
	return res
}

func (p *probeResult) opCount() int {
	n := 0
	for _, ok := range p.ops {
		if ok {
			n++
		}
	}
	return n
}
