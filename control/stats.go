package control

import (
	"reflect"
	"strconv"
	"strings"
	"unicode"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// statsCounters appends the counters of a dependency that reports stats
// (the pool's shm.PoolStats, the engine's xfer.EngineStats): every numeric
// field, named in snake_case, nested structs and slices flattened with
// dotted names. Stats are not a hot path.
func statsCounters(v any, dst []wire.Counter) []wire.Counter {
	switch s := v.(type) {
	case interface{ Stats() shm.PoolStats }:
		return flatten("", reflect.ValueOf(s.Stats()), dst)
	case interface{ Stats() xfer.EngineStats }:
		return flatten("", reflect.ValueOf(s.Stats()), dst)
	}
	return dst
}

// blockClasses returns the pool's block sizes, smallest first, when the
// pool reports them.
func blockClasses(p any) []uint64 {
	s, ok := p.(interface{ Stats() shm.PoolStats })
	if !ok {
		return nil
	}
	cl := s.Stats().Classes
	out := make([]uint64, len(cl))
	for i := range cl {
		out[i] = cl[i].BlockSize
	}
	return out
}

func flatten(prefix string, v reflect.Value, dst []wire.Counter) []wire.Counter {
	switch v.Kind() {
	case reflect.Struct:
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			if t.Field(i).IsExported() {
				dst = flatten(join(prefix, snake(t.Field(i).Name)), v.Field(i), dst)
			}
		}
	case reflect.Slice, reflect.Array:
		for i := 0; i < v.Len() && i < 64; i++ {
			dst = flatten(join(prefix, strconv.Itoa(i)), v.Index(i), dst)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		dst = append(dst, wire.Counter{Name: prefix, Value: v.Uint()})
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if n := v.Int(); n >= 0 {
			dst = append(dst, wire.Counter{Name: prefix, Value: uint64(n)})
		}
	case reflect.Bool:
		var n uint64
		if v.Bool() {
			n = 1
		}
		dst = append(dst, wire.Counter{Name: prefix, Value: n})
	case reflect.Float32, reflect.Float64:
		// Ratios travel in parts per million.
		if f := v.Float(); f >= 0 {
			dst = append(dst, wire.Counter{Name: prefix + "_ppm", Value: uint64(f * 1e6)})
		}
	}
	return dst
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

// snake turns a Go field name into snake_case: BatchesLive → batches_live,
// FreeBytes → free_bytes.
func snake(s string) string {
	var b strings.Builder
	r := []rune(s)
	for i, c := range r {
		if unicode.IsUpper(c) {
			if i > 0 && (unicode.IsLower(r[i-1]) || (i+1 < len(r) && unicode.IsLower(r[i+1]))) {
				b.WriteByte('_')
			}
			c = unicode.ToLower(c)
		}
		b.WriteRune(c)
	}
	return b.String()
}
