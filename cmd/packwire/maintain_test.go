package main

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/procgroup"
)

// TestImportMaintainShow: an imported repository is in the serving layout at
// once, repo show describes it, and maintain finds nothing more to do.
func TestImportMaintainShow(t *testing.T) {
	env := gittest.New(t)
	src := filepath.Join(t.TempDir(), "src.git")
	env.Build(src, gittest.Shape{Commits: 10, Branches: 2, Tags: 2, Seed: 3})
	env.Git(src, "update-ref", "refs/pull/1/head", "main~3")
	data := newData(t)
	out, code := packwire(t, "repo", "import", "app", src, "--data", data)
	if code != 0 || !strings.Contains(out, "full run (imported): ok") {
		t.Fatalf("repo import: %d %s", code, out)
	}
	out, code = packwire(t, "repo", "show", "app", "--data", data)
	for _, want := range []string{"refs: 3 branches, 2 tags, 1 other", "preferred", "multi-pack bitmap: true",
		"closure of 3 branches + 2 tags", "drift 0.0%", "last maintenance: ", "full run (imported): ok",
		"checkout (HEAD's tree): ", " 0 against bases outside the tree"} {
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
	// The runs are in the governor, newest first, with their reason.
	if out, code := packwire(t, "governor", "maintenance", "--repo", "app", "--data", data); code != 0 ||
		!strings.Contains(out, "REASON") || !strings.Contains(strings.SplitN(out, "\n", 3)[1], "requested (--full)") {
		t.Fatalf("governor maintenance: %d %s", code, out)
	}
	if out, code := packwire(t, "governor", "maintenance", "--repo", "other", "--data", data); code != 0 || !strings.Contains(out, "no maintenance runs") {
		t.Fatalf("governor maintenance of a repo without runs: %d %s", code, out)
	}
	if out, code := packwire(t, "maintain", "nope", "--data", data); code == 0 || !strings.Contains(out, "not found") {
		t.Fatalf("maintain of a missing repo: %d %s", code, out)
	}
	if out, code := packwire(t, "repo", "import", "raw", src, "--no-maintain", "--data", data); code != 0 || strings.Contains(out, "full run") {
		t.Fatalf("repo import --no-maintain: %d %s", code, out)
	}
	if out, _ := packwire(t, "repo", "show", "raw", "--data", data); !strings.Contains(out, "preferred pack: none") {
		t.Fatalf("repo import --no-maintain maintained:\n%s", out)
	}
	if out, _ := packwire(t, "serve", "--help"); !strings.Contains(out, "-maintain-interval") || !strings.Contains(out, "-maintain-budget") {
		t.Fatalf("serve --help lacks the maintenance flags:\n%s", out)
	}
}

// TestMaintainKilledAtRandomPoints kills `packwire maintain --full` (its
// process group; its git children die with it) at random points: the
// repository stays fsck-clean and clonable with every ref, and the next
// run brings it into shape.
func TestMaintainKilledAtRandomPoints(t *testing.T) {
	env := gittest.New(t)
	data := newData(t)
	if out, code := packwire(t, "repo", "create", "app", "--data", data); code != 0 {
		t.Fatal(out)
	}
	bare := filepath.Join(data, "repos", "app.git")
	env.Build(bare, gittest.Shape{Commits: 60, Files: 40, BlobBytes: 3000, Branches: 3, Tags: 5, Seed: 9})
	var in strings.Builder
	for i := 1; i <= 300; i++ {
		fmt.Fprintf(&in, "create refs/pull/%d/head main~%d\n", i, i%50)
	}
	cmd := exec.Command("git", "update-ref", "--stdin")
	cmd.Dir, cmd.Env, cmd.Stdin = bare, env.Vars, strings.NewReader(in.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("update-ref: %v %s", err, out)
	}
	want := env.Git(bare, "for-each-ref")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	killed := 0
	for i := 0; i < 5; i++ {
		m := exec.Command(binary, "maintain", "--full", "app", "--data", data)
		if err := procgroup.Start(m); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(10+rng.IntN(200)) * time.Millisecond)
		procgroup.Kill(m)
		if err := m.Wait(); err != nil {
			killed++
		}
		time.Sleep(50 * time.Millisecond) // git children get SIGKILL on packwire's death
		env.Fsck(bare)
		if got := env.Git(bare, "for-each-ref"); got != want {
			t.Fatalf("refs changed after kill %d", i)
		}
		w := filepath.Join(t.TempDir(), fmt.Sprintf("w%d", i))
		env.Git("", "clone", "-q", "--no-local", bare, w)
		env.Git(w, "fetch", "-q", "origin", "refs/pull/7/head")
		env.Fsck(w)
	}
	t.Logf("%d of 5 runs killed before they finished", killed)
	if out, code := packwire(t, "maintain", "app", "--data", data); code != 0 || strings.Contains(out, "error") {
		t.Fatalf("maintain after kills: %d %s", code, out)
	}
	if out, code := packwire(t, "maintain", "app", "--data", data); code != 0 || !strings.Contains(out, "app: in shape") {
		t.Fatalf("not in shape after recovery: %d %s", code, out)
	}
}

// TestImportEmpty: importing an empty upstream succeeds (exit 0) and says
// it is empty; maintenance has nothing to index and is fine with it. On the
// old code the import exited 1 with git's "no pack files to index" though
// the repository had been imported.
func TestImportEmpty(t *testing.T) {
	env := gittest.New(t)
	src := filepath.Join(t.TempDir(), "empty.git")
	env.Git("", "init", "-q", "--bare", src)
	data := newData(t)
	out, code := packwire(t, "repo", "import", "app", src, "--data", data)
	if code != 0 || !strings.Contains(out, "(empty: the source has no refs yet)") || !strings.Contains(out, "full run (imported): ok") {
		t.Fatalf("repo import of an empty upstream: exit %d\n%s", code, out)
	}
	if out, code := packwire(t, "maintain", "app", "--full", "--data", data); code != 0 {
		t.Fatalf("maintain --full of an empty repository: exit %d\n%s", code, out)
	}
}
