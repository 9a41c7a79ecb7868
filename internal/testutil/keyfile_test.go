package testutil

import (
	"os"
	"testing"
)

func TestKeyFile(t *testing.T) {
	p := KeyFile(t, t.TempDir(), "cluster.key", "secret")
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", st.Mode().Perm())
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "secret\n" {
		t.Errorf("key file holds %q, %v", b, err)
	}
}
