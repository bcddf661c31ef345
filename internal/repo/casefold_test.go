package repo

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"

	"packwire/internal/gittest"
)

// TestResolveCaseInsensitiveFS: on a real case-insensitive file system
// (exFAT through FUSE here; the temporary directory on macOS), any spelling
// reaches team/secret.git and the name and path are spelled as on disk.
func TestResolveCaseInsensitiveFS(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is not installed: run scripts/install-deps")
	}
	root := Root{Dir: gittest.CaseInsensitiveDir(t)}
	ctx := context.Background()
	if _, err := root.Create(ctx, "team/secret"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.Create(ctx, "Mixed/Case"); err != nil {
		t.Fatal(err)
	}
	for raw, want := range map[string]string{
		"TEAM/SECRET": "team/secret", "/Team/Secret.GIT": "team/secret", "team/secret.git": "team/secret",
		"mixed/case": "Mixed/Case", "MIXED/CASE.git": "Mixed/Case",
	} {
		r, err := root.Resolve(raw)
		if err != nil || r.Name != want || r.Path != filepath.Join(root.Dir, filepath.FromSlash(want)+".git") {
			t.Errorf("Resolve(%q) = %+v, %v; want name %q at %s", raw, r, err, want, root.PathFor(want))
		}
	}
	if _, err := root.Create(ctx, "TEAM/SECRET"); !errors.Is(err, ErrExists) {
		t.Errorf("creating another spelling of an existing repository: %v", err)
	}
}
