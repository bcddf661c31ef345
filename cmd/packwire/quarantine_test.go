package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/gittest"
)

// TestMaintainRemovesStaleQuarantines: `packwire maintain` removes a push
// quarantine nothing wrote in for over an hour (--dry-run only names it)
// and leaves a fresh one alone. internal/maintain's test makes the real
// thing by killing receive-pack mid-pack.
func TestMaintainRemovesStaleQuarantines(t *testing.T) {
	env := gittest.New(t)
	data := newData(t)
	if out, code := packwire(t, "repo", "create", "app", "--data", data); code != 0 {
		t.Fatal(out)
	}
	bare := filepath.Join(data, "repos", "app.git")
	env.Build(bare, gittest.Shape{Commits: 3, Seed: 1})
	quarantine := func(name string, age time.Duration) string {
		dir := filepath.Join(bare, "objects", name)
		file := filepath.Join(dir, "pack", "tmp_pack_x")
		os.MkdirAll(filepath.Dir(file), 0o755)
		if err := os.WriteFile(file, make([]byte, 3000), 0o644); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		for _, p := range []string{file, filepath.Dir(file), dir} {
			os.Chtimes(p, at, at)
		}
		return dir
	}
	stale := quarantine("tmp_objdir-incoming-Ab12Cd", 3*time.Hour)
	fresh := quarantine("tmp_objdir-incoming-Ef34Gh", time.Minute)

	out, code := packwire(t, "maintain", "--dry-run", "--data", data)
	if code != 0 || !strings.Contains(out, "app: would remove stale push quarantine objects/tmp_objdir-incoming-Ab12Cd (2.9 KiB, last written 3h0m0s ago)") ||
		strings.Contains(out, "Ef34Gh") {
		t.Fatalf("maintain --dry-run: %d\n%s", code, out)
	}
	if _, err := os.Stat(stale); err != nil {
		t.Fatal("--dry-run removed it")
	}
	out, code = packwire(t, "maintain", "--data", data)
	if code != 0 || !strings.Contains(out, "app: removed stale push quarantine objects/tmp_objdir-incoming-Ab12Cd") {
		t.Fatalf("maintain: %d\n%s", code, out)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Fatal("the stale quarantine is still there")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatalf("the fresh quarantine was removed: %v", err)
	}
	env.Fsck(bare)
}
