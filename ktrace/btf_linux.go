package ktrace

import (
	"fmt"

	"github.com/cilium/ebpf/btf"
)

// kernelTypes is the running kernel's BTF, loaded once per Open.
type kernelTypes struct{ spec *btf.Spec }

func loadKernelTypes() (*kernelTypes, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("%w: kernel BTF (/sys/kernel/btf/vmlinux): %v", ErrNoHook, err)
	}
	return &kernelTypes{spec: spec}, nil
}

// offset is the byte offset of the field at path (names of nested members,
// anonymous structs and unions looked through) in struct typ.
func (k *kernelTypes) offset(typ string, path ...string) (uint32, error) {
	var st *btf.Struct
	if err := k.spec.TypeByName(typ, &st); err != nil {
		return 0, fmt.Errorf("%w: struct %s: %v", ErrNoHook, typ, err)
	}
	var off uint32
	var t btf.Type = st
	for _, name := range path {
		members, ok := membersOf(t)
		if !ok {
			return 0, fmt.Errorf("%w: %s.%v: %s is not a struct", ErrNoHook, typ, path, name)
		}
		m, o, ok := findMember(members, name)
		if !ok {
			return 0, fmt.Errorf("%w: struct %s has no field %v", ErrNoHook, typ, path)
		}
		off += o
		t = m.Type
	}
	return off, nil
}

// hasTracepoint reports whether the kernel has the tracepoint name.
func (k *kernelTypes) hasTracepoint(name string) error {
	var td *btf.Typedef
	if err := k.spec.TypeByName("btf_trace_"+name, &td); err != nil {
		return fmt.Errorf("%w: tracepoint %s: %v", ErrNoHook, name, err)
	}
	return nil
}

func membersOf(t btf.Type) ([]btf.Member, bool) {
	switch v := btf.UnderlyingType(t).(type) {
	case *btf.Struct:
		return v.Members, true
	case *btf.Union:
		return v.Members, true
	}
	return nil, false
}

// findMember finds name among members, descending into anonymous ones;
// the offset is in bytes from the start of members' container.
func findMember(members []btf.Member, name string) (btf.Member, uint32, bool) {
	for _, m := range members {
		if m.Name == name {
			return m, m.Offset.Bytes(), true
		}
	}
	for _, m := range members {
		if m.Name != "" {
			continue
		}
		if inner, ok := membersOf(m.Type); ok {
			if f, o, ok := findMember(inner, name); ok {
				return f, m.Offset.Bytes() + o, true
			}
		}
	}
	return btf.Member{}, 0, false
}
