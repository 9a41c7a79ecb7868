package config

import "github.com/tensorcast/tensorcast/xfer"

var (
	// ErrConfig: a configuration value is invalid; the message names the key
	// and the value. Matches xfer.ErrInvalid, a start-up error.
	ErrConfig = xfer.Categorized(xfer.ErrInvalid, "config")
)
