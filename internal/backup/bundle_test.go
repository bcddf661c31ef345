package backup

import (
	"os"
	"path/filepath"
	"testing"

	"packwire/internal/maintain"
)

// The clone bundle is derived (the next full maintenance run writes it
// again) and as large as the preferred pack: a backup copies the
// repository's other files and leaves it, and a half-written one, out.
func TestRepoFilesLeaveCloneBundleOut(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	for _, name := range []string{"config", "description", "packwire-maintenance.json", maintain.BundleFile, maintain.BundleFile + ".tmp"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := copyRepoFiles(src, dst, &linker{stats: &Stats{}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"config", "description", "packwire-maintenance.json"} {
		if _, err := os.Stat(filepath.Join(dst, name)); err != nil {
			t.Errorf("%s not copied: %v", name, err)
		}
	}
	for _, name := range []string{maintain.BundleFile, maintain.BundleFile + ".tmp"} {
		if _, err := os.Stat(filepath.Join(dst, name)); !os.IsNotExist(err) {
			t.Errorf("%s copied (%v)", name, err)
		}
	}
}
