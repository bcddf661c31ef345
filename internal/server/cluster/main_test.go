package cluster

import (
	"os"
	"testing"

	"packwire/internal/pgtest"
)

// TestMain stops the PostgreSQL the tests share (pgtest.Shared).
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
