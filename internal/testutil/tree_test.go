package testutil

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// withoutMain lists the directories under root (a module's) whose tests
// do not run under Main: no TestMain, or one whose body is anything but
// the one call Main(m, ...) (testutil.Main outside this package). It skips
// testdata, vendor and hidden directories, as go test does.
func withoutMain(root string) ([]string, error) {
	type dir struct{ tests, main bool }
	dirs := map[string]*dir{}
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
		if !strings.HasSuffix(name, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if dirs[rel] == nil {
			dirs[rel] = &dir{}
		}
		dirs[rel].tests = true
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == "TestMain" && callsMain(fd) {
				dirs[rel].main = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the tests under %s: %w", root, err)
	}
	var out []string
	for name, d := range dirs {
		if d.tests && !d.main {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// callsMain reports whether fd's body is the one statement Main(m, ...)
// or testutil.Main(m, ...).
func callsMain(fd *ast.FuncDecl) bool {
	if fd.Body == nil || len(fd.Body.List) != 1 {
		return false
	}
	es, ok := fd.Body.List[0].(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	switch fn := call.Fun.(type) {
	case *ast.Ident:
		return fn.Name == "Main"
	case *ast.SelectorExpr:
		pkg, ok := fn.X.(*ast.Ident)
		return ok && pkg.Name == "testutil" && fn.Sel.Name == "Main"
	}
	return false
}

// TestEveryPackageRunsUnderMain: the tests of every package in the module
// run under Main, whose leak checks then cover them. A package with tests
// and no TestMain, or a TestMain that does more than call Main (its own
// leak check, its own exit), fails here by its directory.
func TestEveryPackageRunsUnderMain(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	missing, err := withoutMain(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range missing {
		t.Errorf("%s: tests without testutil.Main: add func TestMain(m *testing.M) { testutil.Main(m) } (options for a child process, a warm-up or a clean-up)", d)
	}
}

// The finder names a planted package without a TestMain and one whose
// TestMain does its own exit, and passes one that calls Main, through an
// external test package too.
func TestWithoutMainFinder(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) { t.Helper(); Plant(t, root, rel, src) }
	write("go.mod", "module example.com/planted\n")
	write("good/a_test.go", "package good_test\n\nimport (\n\t\"testing\"\n\n\t\"x/testutil\"\n)\n\nfunc TestMain(m *testing.M) { testutil.Main(m, testutil.Warm(nil)) }\n")
	write("good/b_test.go", "package good\n\nimport \"testing\"\n\nfunc TestB(t *testing.T) {}\n")
	write("none/a_test.go", "package none\n\nimport \"testing\"\n\nfunc TestA(t *testing.T) {}\n")
	write("own/a_test.go", "package own\n\nimport (\n\t\"os\"\n\t\"testing\"\n)\n\nfunc TestMain(m *testing.M) { os.Exit(m.Run()) }\n")
	write("own/testdata/x_test.go", "package x\n")
	write("notests/a.go", "package notests\n")
	got, err := withoutMain(root)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"none", "own"}; !slices.Equal(got, want) {
		t.Fatalf("withoutMain = %q, want %q", got, want)
	}
}
