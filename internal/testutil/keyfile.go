package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// KeyFile writes key, and a newline, to the file name in dir, readable by
// its owner only, as a daemon wants its cluster key file, and returns the
// file's path.
func KeyFile(t testing.TB, dir, name, key string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
