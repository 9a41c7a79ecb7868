package control

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestGeneratedCodeInOneFile: of the server's own files, proto.go alone
// imports the generated flatbuffers code; the rest speaks package wire
// (control/doc.go). The data plane a client holds is package session's.
func TestGeneratedCodeInOneFile(t *testing.T) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var importers []string
	fset := token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, "github.com/tensorcast/tensorcast/fbs/") {
				importers = append(importers, name)
			}
		}
	}
	if len(names) < 5 {
		t.Fatalf("read %d files: not the package's directory", len(names))
	}
	if want := []string{"proto.go"}; !slices.Equal(importers, want) {
		t.Fatalf("files importing the generated code: %q, want %q", importers, want)
	}
}
