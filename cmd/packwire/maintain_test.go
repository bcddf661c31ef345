package main

import (
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/gittest"
)

// TestImportMaintainShow: an imported repository is in the serving layout at
// once, repo show describes it, and maintain finds nothing more to do.
func TestImportMaintainShow(t *testing.T) {
	env := gittest.New(t)
	src := filepath.Join(t.TempDir(), "src.git")
	env.Build(src, gittest.Shape{Commits: 10, Branches: 2, Tags: 2, Seed: 3})
	env.Git(src, "update-ref", "refs/pull/1/head", "main~3")
	data := filepath.Join(t.TempDir(), "data")
	out, code := packwire(t, "repo", "import", "app", src, "--data", data)
	if code != 0 || !strings.Contains(out, "full run (imported): ok") {
		t.Fatalf("repo import: %d %s", code, out)
	}
	out, code = packwire(t, "repo", "show", "app", "--data", data)
	for _, want := range []string{"refs: 3 branches, 2 tags, 1 other", "preferred", "bitmap: true",
		"closure of 3 branches + 2 tags", "drift 0.0%", "last maintenance: ", "full run (imported): ok"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("repo show: missing %q (exit %d):\n%s", want, code, out)
		}
	}
	if out, code := packwire(t, "maintain", "--data", data); code != 0 || !strings.Contains(out, "app: in shape") {
		t.Fatalf("maintain: %d %s", code, out)
	}
	if out, code := packwire(t, "maintain", "app", "--full", "--data", data); code != 0 || !strings.Contains(out, "app: full run (requested (--full)): ok") {
		t.Fatalf("maintain --full: %d %s", code, out)
	}
	if out, code := packwire(t, "maintain", "nope", "--data", data); code == 0 || !strings.Contains(out, "not found") {
		t.Fatalf("maintain of a missing repo: %d %s", code, out)
	}
	if out, _ := packwire(t, "serve", "--help"); !strings.Contains(out, "-maintain-interval") || !strings.Contains(out, "-maintain-budget") {
		t.Fatalf("serve --help lacks the maintenance flags:\n%s", out)
	}
}
