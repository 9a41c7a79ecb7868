package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksNoDaemon: tcctl checks a config file with package daemon/config
// and must not link the daemon itself, nor what only the daemon needs (the
// etcd client and grpc under the directory).
func TestLinksNoDaemon(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "github.com/tensorcast/tensorcast/daemon" || strings.HasPrefix(p, "go.etcd.io/") ||
			strings.HasPrefix(p, "google.golang.org/grpc") {
			t.Errorf("tcctl links %s", p)
		}
	}
}
