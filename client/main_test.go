package client

import (
	"os"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// mappings counts this process's shared mappings of memfds.
func mappings(t testing.TB) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "/memfd:")
}
