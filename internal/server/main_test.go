package server

import (
	"os"
	"path/filepath"
	"testing"

	"packwire/internal/packcache"
)

// TestMain lets this test binary serve as upload-pack's pack-objects hook,
// as the packwire binary does in production (os.Executable is the hook).
func TestMain(m *testing.M) {
	if os.Getenv(packcache.EnvHook) == "pack-objects" {
		os.Exit(packcache.RunHook(os.Args[1:]))
	}
	code := m.Run()
	if bigTemplate != "" {
		os.RemoveAll(filepath.Dir(bigTemplate))
	}
	os.Exit(code)
}
