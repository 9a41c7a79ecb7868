package ktrace

import "github.com/tensorcast/tensorcast/xfer"

// Sentinel errors of package ktrace. Match them with errors.Is; each also
// matches the xfer category it belongs to. They end a view at start-up and
// never reach a client.
var (
	// ErrNoCapability: the process may not load tracing programs (it lacks
	// CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN, or a security policy
	// refuses them). Matches xfer.ErrPermission.
	ErrNoCapability = xfer.Categorized(xfer.ErrPermission, "ktrace: missing capability")
	// ErrNoHook: the kernel lacks something a view needs (BTF, a
	// tracepoint, a structure field). Matches xfer.ErrNotSupported: this
	// kernel cannot do what the view asks.
	ErrNoHook = xfer.Categorized(xfer.ErrNotSupported, "ktrace: kernel lacks hook")
	// ErrNotSupported: not on this operating system. Matches
	// xfer.ErrNotSupported.
	ErrNotSupported = xfer.Categorized(xfer.ErrNotSupported, "ktrace: not supported on this OS")
)
