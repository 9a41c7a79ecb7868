package store

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the package's tests leak no goroutine and no
// descriptor (pools and staging memory are memfds; rings are fds).
func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild()
		return
	}
	if f, err := os.CreateTemp("", "store-fdwarm"); err == nil {
		_ = os.Remove(f.Name())
		_ = f.Close()
	}
	before := openFDs()
	code := m.Run()
	if code == 0 {
		for fd, link := range openFDs() {
			if before[fd] != link && link != os.DevNull && link != "" {
				fmt.Fprintf(os.Stderr, "descriptor leak: fd %s -> %s\n", fd, link)
				code = 1
			}
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutine leak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func openFDs() map[string]string {
	out := map[string]string{}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return out
	}
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		out[e.Name()] = l
	}
	return out
}
