package ktrace

import (
	"math/bits"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/tensorcast/tensorcast/internal/loghist"
)

// The programs below are built instruction by instruction. Conventions:
// r1-r5 are clobbered by helper calls, r6-r9 survive them, r10 (RFP) is the
// frame pointer; stack slots are named by their offset from it.

// stackPtr sets dst = fp + off.
func stackPtr(dst asm.Register, off int16) asm.Instructions {
	return asm.Instructions{asm.Mov.Reg(dst, asm.RFP), asm.Add.Imm(dst, int32(off))}
}

// probeRead copies size bytes from kernel address src+off to fp+dst and
// jumps to fail unless it worked. src must not be r1-r3.
func probeRead(dst int16, size int32, src asm.Register, off uint32, fail string) asm.Instructions {
	ins := stackPtr(asm.R1, dst)
	return append(ins,
		asm.Mov.Imm(asm.R2, size),
		asm.Mov.Reg(asm.R3, src),
		asm.Add.Imm(asm.R3, int32(off)),
		asm.FnProbeReadKernel.Call(),
		asm.JNE.Imm(asm.R0, 0, fail),
	)
}

// log2Bucket sets r9 to loghist.Index(r8) (r8 unsigned nanoseconds),
// using r1 and r2 as scratch. It falls through to the instruction labeled
// next.
func log2Bucket(next string) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Imm(asm.R9, 0),
		asm.JLE.Imm(asm.R8, 1<<loghist.MinShift, next),
		asm.Mov.Reg(asm.R1, asm.R8),
		asm.Sub.Imm(asm.R1, 1),
		asm.RSh.Imm(asm.R1, loghist.MinShift),
		// r9 = bits.Len64(r1), r1 >= 1, by halving steps.
		asm.Mov.Imm(asm.R9, 1),
		asm.Mov.Reg(asm.R2, asm.R1),
		asm.RSh.Imm(asm.R2, 32),
		asm.JEq.Imm(asm.R2, 0, "b16"),
		asm.Mov.Reg(asm.R1, asm.R2),
		asm.Add.Imm(asm.R9, 32),
		asm.JLT.Imm(asm.R1, 1<<16, "b8").WithSymbol("b16"),
		asm.RSh.Imm(asm.R1, 16),
		asm.Add.Imm(asm.R9, 16),
		asm.JLT.Imm(asm.R1, 1<<8, "b4").WithSymbol("b8"),
		asm.RSh.Imm(asm.R1, 8),
		asm.Add.Imm(asm.R9, 8),
		asm.JLT.Imm(asm.R1, 1<<4, "b2").WithSymbol("b4"),
		asm.RSh.Imm(asm.R1, 4),
		asm.Add.Imm(asm.R9, 4),
		asm.JLT.Imm(asm.R1, 1<<2, "b1").WithSymbol("b2"),
		asm.RSh.Imm(asm.R1, 2),
		asm.Add.Imm(asm.R9, 2),
		asm.JLT.Imm(asm.R1, 1<<1, "clamp").WithSymbol("b1"),
		asm.Add.Imm(asm.R9, 1),
		asm.JLE.Imm(asm.R9, loghist.Buckets-1, next).WithSymbol("clamp"),
		asm.Mov.Imm(asm.R9, loghist.Buckets-1),
	}
}

// countInto adds 1 (and r8 into the second word when sum is set) to the
// value under the key at fp+key in m, creating it from the 16-byte (or
// 8-byte) value built at fp+val when absent. It ends the program.
func countInto(m *ebpf.Map, key, val int16, sum bool) asm.Instructions {
	add := func(label string) asm.Instructions {
		ins := asm.Instructions{
			asm.Mov.Imm(asm.R1, 1).WithSymbol(label),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		}
		if sum {
			ins = append(ins, asm.AddAtomic.Mem(asm.R0, asm.R8, asm.DWord, 8))
		}
		return append(ins, asm.Mov.Imm(asm.R0, 0), asm.Return())
	}
	ins := asm.Instructions{asm.LoadMapPtr(asm.R1, m.FD())}
	ins = append(ins, stackPtr(asm.R2, key)...)
	ins = append(ins, asm.FnMapLookupElem.Call(), asm.JNE.Imm(asm.R0, 0, "add"))
	// Absent: insert {1, r8}; lost a race with another CPU: add to its.
	ins = append(ins, asm.Mov.Imm(asm.R1, 1), asm.StoreMem(asm.RFP, val, asm.R1, asm.DWord))
	if sum {
		ins = append(ins, asm.StoreMem(asm.RFP, val+8, asm.R8, asm.DWord))
	}
	ins = append(ins, asm.LoadMapPtr(asm.R1, m.FD()))
	ins = append(ins, stackPtr(asm.R2, key)...)
	ins = append(ins, stackPtr(asm.R3, val)...)
	ins = append(ins,
		asm.Mov.Imm(asm.R4, int32(ebpf.UpdateNoExist)),
		asm.FnMapUpdateElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMapPtr(asm.R1, m.FD()),
	)
	ins = append(ins, stackPtr(asm.R2, key)...)
	ins = append(ins, asm.FnMapLookupElem.Call(), asm.JNE.Imm(asm.R0, 0, "add"))
	ins = append(ins, asm.Mov.Imm(asm.R0, 0).WithSymbol("out"), asm.Return())
	return append(ins, add("add")...)
}

// uringOffsets are the kernel fields the io_uring programs read.
type uringOffsets struct {
	reqCtx      uint32 // io_kiocb.ctx
	reqUserData uint32 // io_kiocb.cqe.user_data
	cqeUserData uint32 // io_uring_cqe.user_data
}

// pidNS identifies this process's pid namespace (stat of /proc/self/ns/pid)
// and its tgid there.
type pidNS struct {
	dev, ino uint64
	tgid     uint32
}

// requireFlag jumps to fail unless the u64 at fp+off has the bit flag (a
// single bit) set; flag 0 requires nothing. Uses r1.
func requireFlag(off int16, flag uint64, fail string) asm.Instructions {
	if flag == 0 {
		return nil
	}
	return asm.Instructions{
		asm.LoadMem(asm.R1, asm.RFP, off, asm.DWord),
		asm.RSh.Imm(asm.R1, int32(bits.TrailingZeros64(flag))),
		asm.And.Imm(asm.R1, 1),
		asm.JEq.Imm(asm.R1, 0, fail),
	}
}

// uringSubmit: raw_tracepoint io_uring_submit_req(struct io_kiocb *req).
// For this process's requests whose user_data has the bit flag set (any
// when flag is 0), start[{req->ctx, req->cqe.user_data}] = now. The flag is
// tested first: it is the cheapest way out for the requests not timed.
func uringSubmit(o uringOffsets, ns pidNS, flag uint64, start *ebpf.Map) asm.Instructions {
	ins := asm.Instructions{
		asm.LoadMem(asm.R7, asm.R1, 0, asm.DWord), // args[0]: req
	}
	ins = append(ins, probeRead(-8, 8, asm.R7, o.reqUserData, "exit")...)
	ins = append(ins, requireFlag(-8, flag, "exit")...)
	ins = append(ins,
		asm.LoadImm(asm.R1, int64(ns.dev), asm.DWord),
		asm.LoadImm(asm.R2, int64(ns.ino), asm.DWord),
	)
	ins = append(ins, stackPtr(asm.R3, -32)...) // struct bpf_pidns_info {u32 pid, tgid}
	ins = append(ins,
		asm.Mov.Imm(asm.R4, 8),
		asm.FnGetNsCurrentPidTgid.Call(),
		asm.JNE.Imm(asm.R0, 0, "exit"),
		asm.LoadMem(asm.R0, asm.RFP, -28, asm.Word),
		asm.JNE.Imm(asm.R0, int32(ns.tgid), "exit"),
	)
	ins = append(ins, probeRead(-16, 8, asm.R7, o.reqCtx, "exit")...)
	ins = append(ins,
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, -24, asm.R0, asm.DWord),
		asm.LoadMapPtr(asm.R1, start.FD()),
	)
	ins = append(ins, stackPtr(asm.R2, -16)...)
	ins = append(ins, stackPtr(asm.R3, -24)...)
	return append(ins,
		asm.Mov.Imm(asm.R4, int32(ebpf.UpdateAny)),
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("exit"),
		asm.Return(),
	)
}

// uringComplete: raw_tracepoint io_uring_complete(struct io_ring_ctx *ctx,
// void *req, struct io_uring_cqe *cqe). A completion whose user_data has
// bit flag set (any when flag is 0) and whose start was recorded counts
// its latency into hist[{ctx, bucket}] = {count, sum}.
func uringComplete(o uringOffsets, flag uint64, start, hist *ebpf.Map) asm.Instructions {
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R7, asm.R6, 16, asm.DWord), // args[2]: cqe
	}
	ins = append(ins, probeRead(-8, 8, asm.R7, o.cqeUserData, "exit")...)
	ins = append(ins, requireFlag(-8, flag, "exit")...)
	ins = append(ins,
		asm.LoadMem(asm.R1, asm.R6, 0, asm.DWord), // args[0]: ctx
		asm.StoreMem(asm.RFP, -16, asm.R1, asm.DWord),
		asm.LoadMapPtr(asm.R1, start.FD()),
	)
	ins = append(ins, stackPtr(asm.R2, -16)...)
	ins = append(ins,
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "exit"),
		asm.LoadMem(asm.R7, asm.R0, 0, asm.DWord),
		asm.LoadMapPtr(asm.R1, start.FD()),
	)
	ins = append(ins, stackPtr(asm.R2, -16)...)
	ins = append(ins,
		asm.FnMapDeleteElem.Call(),
		asm.FnKtimeGetNs.Call(),
		asm.Mov.Reg(asm.R8, asm.R0),
		asm.Sub.Reg(asm.R8, asm.R7),
		asm.JSGE.Imm(asm.R8, 0, "bucket"),
		asm.Mov.Imm(asm.R8, 0),
	)
	b := log2Bucket("key")
	b[0] = b[0].WithSymbol("bucket")
	ins = append(ins, b...)
	ins = append(ins,
		asm.LoadMem(asm.R1, asm.RFP, -16, asm.DWord).WithSymbol("key"),
		asm.StoreMem(asm.RFP, -32, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, -24, asm.R9, asm.DWord),
	)
	ins = append(ins, countInto(hist, -32, -48, true)...)
	return append(ins, asm.Mov.Imm(asm.R0, 0).WithSymbol("exit"), asm.Return())
}

// tcpOffsets are the struct sock_common fields the retransmit program
// reads (struct sock starts with its sock_common).
type tcpOffsets struct {
	family, num, dport  uint32
	rcvSaddr, daddr     uint32
	v6RcvSaddr, v6Daddr uint32
	hasV6               bool
}

// tupleKeySize is the retransmit map's key: family u16, local port u16
// (host order), remote port [2]byte (network order), pad u16, local
// address [16]byte, remote address [16]byte.
const tupleKeySize = 40

// tcpRetransmit: raw_tracepoint tcp_retransmit_skb(const struct sock *sk,
// const struct sk_buff *skb, int err). Counts per 4-tuple.
func tcpRetransmit(o tcpOffsets, counts *ebpf.Map) asm.Instructions {
	ins := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, 0, asm.DWord), // args[0]: sk
		asm.Mov.Imm(asm.R1, 0),
	}
	for off := int16(-40); off < 0; off += 8 {
		ins = append(ins, asm.StoreMem(asm.RFP, off, asm.R1, asm.DWord))
	}
	ins = append(ins, probeRead(-40, 2, asm.R6, o.family, "exit")...)
	ins = append(ins, probeRead(-38, 2, asm.R6, o.num, "exit")...)
	ins = append(ins, probeRead(-36, 2, asm.R6, o.dport, "exit")...)
	ins = append(ins,
		asm.LoadMem(asm.R7, asm.RFP, -40, asm.Half),
		asm.JNE.Imm(asm.R7, 2, "v6"), // AF_INET
	)
	ins = append(ins, probeRead(-32, 4, asm.R6, o.rcvSaddr, "exit")...)
	ins = append(ins, probeRead(-16, 4, asm.R6, o.daddr, "exit")...)
	ins = append(ins, asm.Ja.Label("count"))
	if o.hasV6 {
		v6 := asm.Instructions{asm.JNE.Imm(asm.R7, 10, "exit").WithSymbol("v6")} // AF_INET6
		v6 = append(v6, probeRead(-32, 16, asm.R6, o.v6RcvSaddr, "exit")...)
		v6 = append(v6, probeRead(-16, 16, asm.R6, o.v6Daddr, "exit")...)
		ins = append(ins, v6...)
	} else {
		ins = append(ins, asm.Ja.Label("exit").WithSymbol("v6"))
	}
	c := countInto(counts, -40, -48, false)
	c[0] = c[0].WithSymbol("count")
	ins = append(ins, c...)
	return append(ins, asm.Mov.Imm(asm.R0, 0).WithSymbol("exit"), asm.Return())
}
