package queue

import (
	"encoding/binary"
	"testing"
)

// FuzzTake fills a queue's shared words and submission ring with arbitrary
// bytes, as a hostile client can, and checks that the daemon's side takes
// only what the ring can hold, decodes any entry without panicking, and
// bounds every data reference.
func FuzzTake(f *testing.F) {
	f.Add(uint32(1), uint32(0), []byte{OpRead, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add(uint32(9), uint32(0), make([]byte, 64))
	f.Add(uint32(0xffffffff), uint32(5), make([]byte, 200))
	f.Add(uint32(4), uint32(0xfffffff0), []byte{OpWrite, SQEFlagNotify, 0, 0, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, tail, cqHead uint32, body []byte) {
		g, err := NewGeometry(8, 16, 4096)
		if err != nil {
			t.Fatal(err)
		}
		mem := make([]byte, g.Size+8) // 8-aligned enough for the atomics
		d := NewDaemonRing(mem[:g.Size], g, 1)
		copy(mem[g.SQOff:g.CQOff], body)
		d.w.sqTail.Store(tail)
		d.w.cqHead.Store(cqHead)
		var sqes [32]SQE
		buf := make([]byte, 4096)
		for round := 0; round < 3; round++ {
			n := d.Take(sqes[:])
			if n < 0 || n > int(g.SQEntries) {
				t.Fatalf("took %d from a ring of %d", n, g.SQEntries)
			}
			for i := 0; i < n; i++ {
				e := &sqes[i]
				ok := d.Data(buf, e.NotifyOff, e.NotifyLen)
				if ok && uint64(e.NotifyOff)+uint64(e.NotifyLen) > uint64(g.DataSize) {
					t.Fatalf("Data accepted %d bytes at %d in a %d-byte area", e.NotifyLen, e.NotifyOff, g.DataSize)
				}
				d.Post(&CQE{UserData: e.UserData})
			}
			d.Publish()
			if _, unreaped, _ := d.Counts(); unreaped > g.CQEntries {
				t.Fatalf("%d unreaped completions in a ring of %d", unreaped, g.CQEntries)
			}
			d.w.sqTail.Store(binary.LittleEndian.Uint32(append(body, 0, 0, 0, 0)[:4]) + tail)
		}
	})
}
