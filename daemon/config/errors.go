package config

import "errors"

var (
	// ErrConfig: a configuration value is invalid; the message names the key
	// and the value.
	ErrConfig = errors.New("config")
)
