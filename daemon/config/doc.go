// Package config is tensorcastd's configuration: the Config type, its
// defaults, its loading from file, environment and flags (Load), its
// validation (Validate) and the check of a config file that tcctl runs
// (CheckFile). It depends on no part of the daemon's machinery, so a tool
// that only checks a file does not link the daemon.
package config
