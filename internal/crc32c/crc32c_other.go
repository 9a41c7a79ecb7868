//go:build !amd64

package crc32c

const (
	haveFold   = false
	implFold   = ""
	canHybrid  = false
	haveHybrid = false
	implHybrid = ""
)

func foldUpdate(s uint32, p []byte) uint32 { panic("crc32c: no fold on this architecture") }

func hybridUpdate(s uint32, p []byte) (uint32, []byte) {
	panic("crc32c: no hybrid on this architecture")
}
