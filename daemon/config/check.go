package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Problem is one error in a config file: the key, the line it is on (0
// when unknown) and what is wrong.
type Problem struct {
	Key  string
	Line int
	Msg  string
}

func (p Problem) String() string {
	if p.Key == "" {
		return p.Msg
	}
	return p.Key + ": " + p.Msg
}

// CheckFile validates a config file on top of the defaults, without the
// environment or flags and without starting anything, and returns every
// problem it finds. A file that does not parse has one problem, where the
// parser stopped. Otherwise each invalid value is reported, then set back
// to its default so the next one can be found.
func CheckFile(path string) ([]Problem, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := Defaults()
	md, err := toml.Decode(string(text), &c)
	if err != nil {
		return []Problem{decodeProblem(err, string(text))}, nil
	}
	var out []Problem
	for _, k := range md.Undecoded() {
		key := k.String()
		out = append(out, Problem{Key: key, Line: keyLine(string(text), key, ""), Msg: "unknown key"})
	}
	defaults := Defaults()
	seen := map[string]bool{}
	for range 64 {
		err := c.Validate()
		if err == nil {
			break
		}
		var ke *KeyError
		if !errors.As(err, &ke) {
			out = append(out, Problem{Msg: err.Error()})
			break
		}
		out = append(out, Problem{Key: ke.Key, Line: keyLine(string(text), ke.Key, ke.Value),
			Msg: fmt.Sprintf("%q: %s", ke.Value, ke.Why)})
		top, _, _ := strings.Cut(ke.Key, ".")
		if seen[top] || !resetKey(&c, &defaults, top) {
			break // a check that a reset does not clear: report it once
		}
		seen[top] = true
	}
	return out, nil
}

// decodeProblem turns a TOML decoding error into a Problem with the key
// and line the decoder names.
func decodeProblem(err error, text string) Problem {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		return Problem{Key: pe.LastKey, Line: pe.Position.Line, Msg: pe.Message}
	}
	p := Problem{Msg: err.Error()}
	if m := regexp.MustCompile(`line (\d+)`).FindStringSubmatch(p.Msg); m != nil {
		p.Line, _ = strconv.Atoi(m[1])
	}
	if m := regexp.MustCompile(`last key "([^"]*)"`).FindStringSubmatch(p.Msg); m != nil {
		p.Key = m[1]
		if p.Line == 0 {
			p.Line = keyLine(text, p.Key, "")
		}
	}
	return p
}

// resetKey sets the field tagged toml:"key" in c to its value in d,
// looking into the embedded key groups (DirectoryConfig, AccessConfig,
// StoreConfig) too.
func resetKey(c, d *Config, key string) bool {
	return resetField(reflect.ValueOf(c).Elem(), reflect.ValueOf(d).Elem(), key)
}

func resetField(cv, dv reflect.Value, key string) bool {
	t := cv.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if resetField(cv.Field(i), dv.Field(i), key) {
				return true
			}
			continue
		}
		if f.Tag.Get("toml") == key {
			cv.Field(i).Set(dv.Field(i))
			return true
		}
		if f.Anonymous && f.Type.Kind() == reflect.Struct && resetField(cv.Field(i), dv.Field(i), key) {
			return true
		}
	}
	return false
}

// keyLine finds the line of key ("name", or "table.name" for a key in a
// [table] or [[table]]) in a TOML text; among several, the first whose
// line holds value. 0 when not found.
func keyLine(text, key, value string) int {
	table, name := "", key
	if i := strings.LastIndex(key, "."); i >= 0 {
		table, name = key[:i], key[i+1:]
	}
	keyRe := regexp.MustCompile(`^\s*"?` + regexp.QuoteMeta(name) + `"?\s*=`)
	hdrRe := regexp.MustCompile(`^\s*\[\[?\s*([^\]]+?)\s*\]\]?`)
	cur, first := "", 0
	for i, l := range strings.Split(text, "\n") {
		if m := hdrRe.FindStringSubmatch(l); m != nil {
			cur = m[1]
			continue
		}
		if cur != table || !keyRe.MatchString(l) {
			continue
		}
		if value == "" || strings.Contains(l, value) {
			return i + 1
		}
		if first == 0 {
			first = i + 1
		}
	}
	return first
}
