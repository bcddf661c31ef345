package server

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain removes the shared template repository after the tests. (This
// binary serves as git's hooks through internal/hookmode, as packwire does.)
func TestMain(m *testing.M) {
	code := m.Run()
	if bigTemplate != "" {
		os.RemoveAll(filepath.Dir(bigTemplate))
	}
	os.Exit(code)
}
