// Package fbs holds the flatbuffers schemas of tensorcast's wire protocols
// and, in sub-packages, the Go code flatc generates from them. The generated
// code is committed; `go generate ./fbs/...` (or `make generate`) reproduces
// it byte for byte with Debian's flatc 2.0.8.
package fbs

//go:generate flatc --go -o . control.fbs
