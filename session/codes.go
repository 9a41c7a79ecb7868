package session

import "github.com/tensorcast/tensorcast/xfer"

// CodeOf and CodeForState are the daemon's mapping of errors to the codes a
// client sees (the server's, which sets them before its first session), and
// the code of a task that ended in a state with an error.
var (
	CodeOf       func(error) Code
	CodeForState func(xfer.State, error) Code
)
