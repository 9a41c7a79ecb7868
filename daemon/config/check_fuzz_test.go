package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzCheckFile: config check reads files operators (and their tools)
// write; whatever they hold, it reports problems and never panics.
func FuzzCheckFile(f *testing.F) {
	f.Add("pool_size = \"1k\"\nhugepages = \"maybe\"\n")
	f.Add("[[peers]]\nid = \"b\"\naddr = \"x\"\n")
	f.Add("socket = \n")
	f.Add("metrics_address = 9464\nebpf = true\n")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, body string) {
		p := filepath.Join(dir, "c.toml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		ps, err := CheckFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, pr := range ps {
			if pr.Msg == "" || pr.Line < 0 {
				t.Fatalf("problem without a message or with line %d: %+v", pr.Line, pr)
			}
		}
	})
}
