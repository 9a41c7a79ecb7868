// Package deps pins the modules the project builds on, so that go.mod keeps
// them while the packages that use them grow (and `go mod tidy` is stable).
// It is never imported by a binary.
package deps

import (
	_ "github.com/BurntSushi/toml"
	_ "github.com/Mellanox/rdmamap"
	_ "github.com/cilium/ebpf"
	_ "github.com/google/flatbuffers/go"
	_ "github.com/panjf2000/gnet/v2"
	_ "go.uber.org/goleak"
	_ "golang.org/x/sys/unix"
)
