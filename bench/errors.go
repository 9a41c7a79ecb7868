package bench

import "errors"

// Sentinel errors of the benchmark harness. Match them with errors.Is; the
// returned errors wrap them with the file, line, option or engine concerned.
// They are in no xfer category: tcbench prints them and exits, and no
// daemon answers a client with them.
var (
	// ErrUnknownOption: a job file or command line names an option tcbench
	// does not know.
	ErrUnknownOption = errors.New("bench: unknown option")
	// ErrBadValue: an option's value does not parse or is out of its limits.
	ErrBadValue = errors.New("bench: bad value")
	// ErrSyntax: a job file line is neither a section, an option nor a
	// comment.
	ErrSyntax = errors.New("bench: syntax error")
	// ErrDuplicateJob: two jobs have the same name.
	ErrDuplicateJob = errors.New("bench: duplicate job name")
	// ErrMissingOption: a job lacks an option its engine needs (a filename
	// for uring, a target for tcp and rdma).
	ErrMissingOption = errors.New("bench: missing option")
	// ErrNoJobs: nothing to run.
	ErrNoJobs = errors.New("bench: no jobs")
	// ErrEngineUnavailable: the engine is known but cannot run in this build
	// or on this host.
	ErrEngineUnavailable = errors.New("bench: engine not available")
	// ErrVerify: bytes that came back do not match what was written.
	ErrVerify = errors.New("bench: verify failed")
	// ErrIO: an I/O request ended with an error.
	ErrIO = errors.New("bench: I/O failed")
	// ErrToolMissing: a reference tool (fio, iperf3, perftest) is not
	// installed.
	ErrToolMissing = errors.New("bench: reference tool missing")
	// ErrToolOutput: a reference tool's output could not be understood.
	ErrToolOutput = errors.New("bench: reference tool output not understood")
	// ErrNoTarget: a tcp or rdma job's target segment cannot be opened
	// (not exported on the peer, or the peer unknown to the daemon).
	ErrNoTarget = errors.New("bench: target segment not reachable")
	// ErrDaemon: the spawned daemon did not start or did not stop cleanly.
	ErrDaemon = errors.New("bench: daemon failed")
)
