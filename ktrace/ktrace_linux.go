package ktrace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/loghist"
)

// Bounds of the maps.
const (
	maxInflight = 65536 // io_uring requests in flight with a recorded start (LRU)
	maxHist     = 64 * loghist.Buckets
	maxTuples   = 16384 // connections with retransmits (LRU)
)

// Views are the loaded kernel-side views. The zero value is not usable;
// Open makes one.
type Views struct {
	uring *uringView
	tcp   *tcpView
}

type uringView struct {
	start, hist *ebpf.Map
	progs       []*ebpf.Program
	links       []link.Link

	// mu guards ids: the order rings were first seen in.
	mu  sync.Mutex
	ids map[uint64]int
}

type tcpView struct {
	counts *ebpf.Map
	prog   *ebpf.Program
	link   link.Link
}

// Open loads the views in want. It returns the views it could load, and
// for each one it could not, an error in errs (matching ErrNoCapability or
// ErrNoHook, naming what is missing). v is nil only when none loaded.
func Open(want []View, opts Options) (v *Views, errs map[View]error) {
	errs = map[View]error{}
	fail := func(err error) (*Views, map[View]error) {
		for _, w := range want {
			errs[w] = err
		}
		return nil, errs
	}
	if bits.OnesCount64(opts.UringFlag) > 1 {
		return fail(fmt.Errorf("ktrace: Options.UringFlag %#x is more than one bit", opts.UringFlag))
	}
	if err := checkCapabilities(); err != nil {
		return fail(err)
	}
	k, err := loadKernelTypes()
	if err != nil {
		return fail(err)
	}
	v = &Views{}
	for _, w := range want {
		switch w {
		case ViewUring:
			v.uring, err = openUring(k, opts.UringFlag)
		case ViewTCP:
			v.tcp, err = openTCP(k)
		default:
			err = fmt.Errorf("%w: unknown view %q", ErrNoHook, w)
		}
		if err != nil {
			errs[w] = err
		}
	}
	if v.uring == nil && v.tcp == nil {
		return nil, errs
	}
	return v, errs
}

// Has reports whether view w is loaded.
func (v *Views) Has(w View) bool {
	switch w {
	case ViewUring:
		return v.uring != nil
	case ViewTCP:
		return v.tcp != nil
	}
	return false
}

// Close detaches the programs and frees the maps.
func (v *Views) Close() error {
	var errs []error
	if u := v.uring; u != nil {
		for _, l := range u.links {
			errs = append(errs, l.Close())
		}
		for _, p := range u.progs {
			errs = append(errs, p.Close())
		}
		errs = append(errs, u.start.Close(), u.hist.Close())
	}
	if t := v.tcp; t != nil {
		errs = append(errs, t.link.Close(), t.prog.Close(), t.counts.Close())
	}
	return errors.Join(errs...)
}

// checkCapabilities fails unless the effective set has CAP_SYS_ADMIN, or
// both CAP_BPF and CAP_PERFMON.
func checkCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("%w: capget: %v", ErrNoCapability, err)
	}
	has := func(c int) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	if has(unix.CAP_SYS_ADMIN) || has(unix.CAP_BPF) && has(unix.CAP_PERFMON) {
		return nil
	}
	return fmt.Errorf("%w: the daemon lacks CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)", ErrNoCapability)
}

// loadErr sorts a load or attach failure: permission problems are
// capabilities (or a security policy), the rest the kernel's.
func loadErr(what string, err error) error {
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("%w: %s: %v", ErrNoCapability, what, err)
	}
	return fmt.Errorf("%w: %s: %v", ErrNoHook, what, err)
}

func newProgram(name string, ins asm.Instructions) (*ebpf.Program, error) {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         name,
		Type:         ebpf.RawTracepoint,
		Instructions: ins,
		License:      "GPL",
	})
	if err != nil {
		return nil, loadErr("loading "+name, err)
	}
	return p, nil
}

func attach(tp string, p *ebpf.Program) (link.Link, error) {
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp, Program: p})
	if err != nil {
		return nil, loadErr("attaching to tracepoint "+tp, err)
	}
	return l, nil
}

func ownPidNS() (pidNS, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return pidNS{}, fmt.Errorf("%w: pid namespace (/proc/self/ns/pid): %v", ErrNoHook, err)
	}
	return pidNS{dev: st.Dev, ino: st.Ino, tgid: uint32(os.Getpid())}, nil
}

func openUring(k *kernelTypes, flag uint64) (_ *uringView, err error) {
	for _, tp := range []string{"io_uring_submit_req", "io_uring_complete"} {
		if err := k.hasTracepoint(tp); err != nil {
			return nil, err
		}
	}
	var o uringOffsets
	if o.reqCtx, err = k.offset("io_kiocb", "ctx"); err != nil {
		return nil, err
	}
	if o.reqUserData, err = k.offset("io_kiocb", "cqe", "user_data"); err != nil {
		return nil, err
	}
	if o.cqeUserData, err = k.offset("io_uring_cqe", "user_data"); err != nil {
		return nil, err
	}
	ns, err := ownPidNS()
	if err != nil {
		return nil, err
	}
	u := &uringView{ids: map[uint64]int{}}
	defer func() {
		if err != nil {
			for _, l := range u.links {
				l.Close()
			}
			for _, p := range u.progs {
				p.Close()
			}
			if u.start != nil {
				u.start.Close()
			}
			if u.hist != nil {
				u.hist.Close()
			}
		}
	}()
	if u.start, err = ebpf.NewMap(&ebpf.MapSpec{Name: "tc_uring_start", Type: ebpf.LRUHash, KeySize: 16, ValueSize: 8, MaxEntries: maxInflight}); err != nil {
		return nil, loadErr("creating the io_uring start map", err)
	}
	if u.hist, err = ebpf.NewMap(&ebpf.MapSpec{Name: "tc_uring_hist", Type: ebpf.Hash, KeySize: 16, ValueSize: 16, MaxEntries: maxHist}); err != nil {
		return nil, loadErr("creating the io_uring histogram map", err)
	}
	for _, p := range []struct {
		tp, name string
		ins      asm.Instructions
	}{
		{"io_uring_complete", "tc_uring_done", uringComplete(o, flag, u.start, u.hist)},
		{"io_uring_submit_req", "tc_uring_submit", uringSubmit(o, ns, flag, u.start)},
	} {
		prog, err := newProgram(p.name, p.ins)
		if err != nil {
			return nil, err
		}
		u.progs = append(u.progs, prog)
		l, err := attach(p.tp, prog)
		if err != nil {
			return nil, err
		}
		u.links = append(u.links, l)
	}
	return u, nil
}

func openTCP(k *kernelTypes) (_ *tcpView, err error) {
	if err := k.hasTracepoint("tcp_retransmit_skb"); err != nil {
		return nil, err
	}
	var o tcpOffsets
	for _, f := range []struct {
		dst  *uint32
		name string
	}{
		{&o.family, "skc_family"}, {&o.num, "skc_num"}, {&o.dport, "skc_dport"},
		{&o.rcvSaddr, "skc_rcv_saddr"}, {&o.daddr, "skc_daddr"},
	} {
		if *f.dst, err = k.offset("sock_common", f.name); err != nil {
			return nil, err
		}
	}
	// IPv6 fields exist only with CONFIG_IPV6; IPv4 is counted without.
	o.v6RcvSaddr, err = k.offset("sock_common", "skc_v6_rcv_saddr")
	if err == nil {
		o.v6Daddr, err = k.offset("sock_common", "skc_v6_daddr")
	}
	o.hasV6 = err == nil
	t := &tcpView{}
	defer func() {
		if err != nil {
			if t.prog != nil {
				t.prog.Close()
			}
			if t.counts != nil {
				t.counts.Close()
			}
		}
	}()
	if t.counts, err = ebpf.NewMap(&ebpf.MapSpec{Name: "tc_tcp_retrans", Type: ebpf.LRUHash, KeySize: tupleKeySize, ValueSize: 8, MaxEntries: maxTuples}); err != nil {
		return nil, loadErr("creating the retransmit map", err)
	}
	if t.prog, err = newProgram("tc_tcp_retrans", tcpRetransmit(o, t.counts)); err != nil {
		return nil, err
	}
	if t.link, err = attach("tcp_retransmit_skb", t.prog); err != nil {
		return nil, err
	}
	return t, nil
}

// Rings returns this process's io_uring rings with the latencies the
// kernel saw, in ID order; nil without the uring view.
func (v *Views) Rings() []Ring {
	u := v.uring
	if u == nil {
		return nil
	}
	var key [16]byte
	var val [16]byte
	per := map[uint64]*loghist.Snapshot{}
	it := u.hist.Iterate()
	for it.Next(&key, &val) {
		ctx := binary.NativeEndian.Uint64(key[:8])
		b := binary.NativeEndian.Uint64(key[8:])
		if b >= loghist.Buckets {
			continue
		}
		s := per[ctx]
		if s == nil {
			s = &loghist.Snapshot{}
			per[ctx] = s
		}
		s.Counts[b] += binary.NativeEndian.Uint64(val[:8])
		s.Sum += binary.NativeEndian.Uint64(val[8:])
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	ctxs := make([]uint64, 0, len(per))
	for c := range per {
		ctxs = append(ctxs, c)
	}
	slices.Sort(ctxs)
	for _, c := range ctxs {
		if _, ok := u.ids[c]; !ok {
			u.ids[c] = len(u.ids) + 1
		}
	}
	out := make([]Ring, 0, len(ctxs))
	for _, c := range ctxs {
		out = append(out, Ring{ID: u.ids[c], Latency: *per[c]})
	}
	slices.SortFunc(out, func(a, b Ring) int { return a.ID - b.ID })
	return out
}

// Retransmits returns every connection the kernel counted retransmits
// for (every process's: the caller picks its own tuples); nil without the
// tcp view.
func (v *Views) Retransmits() []Retransmit {
	t := v.tcp
	if t == nil {
		return nil
	}
	var key [tupleKeySize]byte
	var n uint64
	var out []Retransmit
	it := t.counts.Iterate()
	for it.Next(&key, &n) {
		if tu, ok := decodeTuple(key); ok {
			out = append(out, Retransmit{Tuple: tu, Count: n})
		}
	}
	return out
}

func decodeTuple(k [tupleKeySize]byte) (Tuple, bool) {
	family := binary.NativeEndian.Uint16(k[0:])
	lport := binary.NativeEndian.Uint16(k[2:])
	rport := binary.BigEndian.Uint16(k[4:])
	var la, ra netip.Addr
	switch family {
	case unix.AF_INET:
		la = netip.AddrFrom4([4]byte(k[8:12]))
		ra = netip.AddrFrom4([4]byte(k[24:28]))
	case unix.AF_INET6:
		la = netip.AddrFrom16([16]byte(k[8:24])).Unmap()
		ra = netip.AddrFrom16([16]byte(k[24:40])).Unmap()
	default:
		return Tuple{}, false
	}
	return Tuple{Local: netip.AddrPortFrom(la, lport), Remote: netip.AddrPortFrom(ra, rport)}, true
}
