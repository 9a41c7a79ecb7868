package ktrace

import "errors"

var (
	// ErrNoCapability: the process may not load tracing programs (it lacks
	// CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN, or a security policy
	// refuses them).
	ErrNoCapability = errors.New("ktrace: missing capability")
	// ErrNoHook: the kernel lacks something a view needs (BTF, a
	// tracepoint, a structure field).
	ErrNoHook = errors.New("ktrace: kernel lacks hook")
	// ErrNotSupported: not on this operating system.
	ErrNotSupported = errors.New("ktrace: not supported on this OS")
)
