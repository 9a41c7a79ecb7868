package keyblock_test

import (
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }
