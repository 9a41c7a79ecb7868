package daemon

import "github.com/tensorcast/tensorcast/daemon/config"

var (
	// ErrConfig: a configuration value is invalid; the message names the key
	// and the value.
	ErrConfig = config.ErrConfig
)
