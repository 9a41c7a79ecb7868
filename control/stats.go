package control

import (
	"reflect"
	"strconv"
	"strings"
	"unicode"
)

// statsCounters appends the numeric fields of v.Stats() (any struct the
// pool or engine returns) as counters named in snake_case; nested structs
// and slices of structs are flattened with dotted names. It returns dst
// unchanged when v has no Stats method. Stats are not a hot path.
func statsCounters(v any, dst []Counter) []Counter {
	m := reflect.ValueOf(v).MethodByName("Stats")
	if !m.IsValid() || m.Type().NumIn() != 0 || m.Type().NumOut() != 1 {
		return dst
	}
	return flatten("", m.Call(nil)[0], dst)
}

func flatten(prefix string, v reflect.Value, dst []Counter) []Counter {
	switch v.Kind() {
	case reflect.Struct:
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			if !t.Field(i).IsExported() {
				continue
			}
			dst = flatten(join(prefix, snake(t.Field(i).Name)), v.Field(i), dst)
		}
	case reflect.Slice, reflect.Array:
		for i := 0; i < v.Len() && i < 64; i++ {
			dst = flatten(join(prefix, itoa(i)), v.Index(i), dst)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		dst = append(dst, Counter{prefix, v.Uint()})
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if n := v.Int(); n >= 0 {
			dst = append(dst, Counter{prefix, uint64(n)})
		}
	case reflect.Bool:
		var n uint64
		if v.Bool() {
			n = 1
		}
		dst = append(dst, Counter{prefix, n})
	case reflect.Float32, reflect.Float64:
		// Ratios are sent in parts per million.
		dst = append(dst, Counter{prefix + "_ppm", uint64(v.Float() * 1e6)})
	}
	return dst
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

func itoa(i int) string {
	return strconv.Itoa(i)
}

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

// blockClasses returns the pool's block sizes when its Stats carries
// Classes[].BlockSize.
func blockClasses(p any) []uint64 {
	m := reflect.ValueOf(p).MethodByName("Stats")
	if !m.IsValid() || m.Type().NumIn() != 0 || m.Type().NumOut() != 1 {
		return nil
	}
	st := m.Call(nil)[0]
	if st.Kind() != reflect.Struct {
		return nil
	}
	cl := st.FieldByName("Classes")
	if !cl.IsValid() || cl.Kind() != reflect.Slice {
		return nil
	}
	var out []uint64
	for i := 0; i < cl.Len(); i++ {
		e := cl.Index(i)
		if e.Kind() != reflect.Struct {
			return nil
		}
		bs := e.FieldByName("BlockSize")
		if !bs.IsValid() || bs.Kind() != reflect.Uint64 {
			return nil
		}
		out = append(out, bs.Uint())
	}
	return out
}
