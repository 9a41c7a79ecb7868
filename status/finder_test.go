package status_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// exportedErrors finds, in the non-test Go source under root (a module's
// directory), every exported package-level variable whose name starts with
// Err and whose type is error: declared as error, or with no type (the
// table that holds its value, typed error, checks the rest when it
// compiles). It names each as "dir.ErrName", dir the package's directory
// relative to root ("ErrName" for the root package). It skips test files,
// testdata, vendor and hidden directories, and package main, whose
// variables nothing can import. A file that does not parse is an error, so
// that nothing is missed silently.
func exportedErrors(root string) ([]string, error) {
	seen := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		prefix := filepath.ToSlash(rel) + "."
		if rel == "." {
			prefix = ""
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); vs.Type != nil && (!ok || id.Name != "error") {
					continue
				}
				for _, n := range vs.Names {
					if n.IsExported() && strings.HasPrefix(n.Name, "Err") {
						seen[prefix+n.Name] = true
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("finding exported errors under %s: %w", root, err)
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}
