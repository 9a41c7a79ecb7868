package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// ModuleRoot is the directory of the go.mod above the working directory,
// for tests that read the module's own source (the error and TestMain
// finders).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = up
	}
}

// Plant writes src to root/rel, making its directories: a file of a
// source tree a finder's test plants.
func Plant(t testing.TB, root, rel, src string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
}
