package daemon

import "github.com/tensorcast/tensorcast/daemon/config"

// The daemon's configuration is package config's; these names keep the
// daemon's callers and tests speaking of daemon.Config.
type (
	Config          = config.Config
	PeerConfig      = config.PeerConfig
	AccessConfig    = config.AccessConfig
	TenantConfig    = config.TenantConfig
	DirectoryConfig = config.DirectoryConfig
	StoreConfig     = config.StoreConfig
	KeyError        = config.KeyError
	Problem         = config.Problem
	Size            = config.Size
	Duration        = config.Duration
	FileMode        = config.FileMode
)

// Defaults, Load, ParseSize and CheckFile are package config's.
var (
	Defaults  = config.Defaults
	Load      = config.Load
	ParseSize = config.ParseSize
	CheckFile = config.CheckFile
)
