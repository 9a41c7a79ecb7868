//go:build !amd64

package crc32c

const (
	haveFold = false
	implFold = ""
)

func foldUpdate(s uint32, p []byte) uint32 { panic("crc32c: no fold on this architecture") }
