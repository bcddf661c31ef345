package bench

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	"packwire/internal/gittest"
)

// A server that ignores --filter gives a full clone that git accepts with a
// warning, recording the filter and the promisor remote all the same: the
// shape check must still call it not filtered, and a server that filters
// must pass.
func TestCheckCatchesIgnoredFilter(t *testing.T) {
	env := gittest.New(t)
	bare := filepath.Join(t.TempDir(), "src.git")
	if out, err := exec.Command("git", "init", "-q", "--bare", bare).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	env.Build(bare, gittest.Shape{Commits: 10, Files: 5, BlobBytes: 500, Seed: 3})
	c, err := newClient("git", filepath.Join(t.TempDir(), "home"), 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{client: c}
	t4, _ := Lookup("T4")
	for _, allow := range []string{"false", "true"} {
		env.Git(bare, "config", "uploadpack.allowFilter", allow)
		dir := filepath.Join(t.TempDir(), "clone")
		if out, err := c.output(context.Background(), t.TempDir(), "clone", "-q", "--no-local", "--filter=blob:none", "file://"+bare, dir); err != nil {
			t.Fatalf("clone: %v %s", err, out)
		}
		got := r.check(context.Background(), t4, dir)
		if want := allow == "true"; got.OK != want {
			t.Fatalf("allowFilter=%s: check OK=%v, want %v (%+v)", allow, got.OK, want, got)
		}
	}
}
