package wire

import (
	"reflect"
	"strconv"
	"strings"
	"unicode"
)

// AppendCounters appends the counters of a stats snapshot (a struct such
// as shm.PoolStats or xfer.EngineStats) to dst, as Stats answers carry
// them: every exported numeric field, named in snake_case (BatchesLive →
// batches_live), nested structs and slices (up to 64 items) flattened with
// dotted names (classes.0.block_size), bools as 0 or 1, negative integers
// left out, ratios in parts per million (fragmentation_ppm). It uses
// reflection: stats are not a hot path.
func AppendCounters(dst []Counter, v any) []Counter {
	return flatten("", reflect.ValueOf(v), dst)
}

func flatten(prefix string, v reflect.Value, dst []Counter) []Counter {
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
		dst = append(dst, Counter{Name: prefix, Value: v.Uint()})
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if n := v.Int(); n >= 0 {
			dst = append(dst, Counter{Name: prefix, Value: uint64(n)})
		}
	case reflect.Bool:
		var n uint64
		if v.Bool() {
			n = 1
		}
		dst = append(dst, Counter{Name: prefix, Value: n})
	case reflect.Float32, reflect.Float64:
		if f := v.Float(); f >= 0 {
			dst = append(dst, Counter{Name: prefix + "_ppm", Value: uint64(f * 1e6)})
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
// FreeBytes → free_bytes, IOInFlight → io_in_flight.
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
