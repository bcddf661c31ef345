package reach

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/repostate"
)

func TestTipsFromFiles(t *testing.T) {
	dir := t.TempDir()
	a, b, c, d, e := "1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222",
		"3333333333333333333333333333333333333333", "4444444444444444444444444444444444444444", "5555555555555555555555555555555555555555"
	os.WriteFile(filepath.Join(dir, "packed-refs"), []byte("# pack-refs with: peeled fully-peeled sorted\n"+
		a+" refs/heads/main\n"+b+" refs/tags/v1\n^"+c+"\n"+d+" refs/packwire/hidden\n^"+e+"\n"), 0o644)
	os.MkdirAll(filepath.Join(dir, "refs", "heads", "x"), 0o755)
	os.MkdirAll(filepath.Join(dir, "refs", "packwire"), 0o755)
	os.WriteFile(filepath.Join(dir, "refs", "heads", "x", "y"), []byte(e+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "refs", "packwire", "z"), []byte(d+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "HEAD"), []byte("ref: refs/heads/main\n"), 0o644)
	tips, err := Tips(dir)
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{a: true, b: true, c: true, e: true, d: false} {
		if tips[id] != want {
			t.Errorf("%s: tip %v, want %v", id[:1], tips[id], want)
		}
	}
}

func TestWants(t *testing.T) {
	got := Wants([]string{"want 1111111111111111111111111111111111111111 multi_ack side-band-64k\n", "want 2222222222222222222222222222222222222222\n",
		"want-ref refs/heads/main\n", "have 3333333333333333333333333333333333333333\n", "want zz\n"})
	if len(got) != 2 || got[1] != "2222222222222222222222222222222222222222" {
		t.Fatalf("wants %v", got)
	}
}

// TestKeptTipsFollowRefsAtOnce: tips are kept between checks, yet a
// branch deleted just now no longer makes its commit servable, and one
// created just now does (no wait in between).
func TestKeptTipsFollowRefsAtOnce(t *testing.T) {
	env := gittest.New(t)
	repo := filepath.Join(t.TempDir(), "r.git")
	env.Build(repo, gittest.Shape{Commits: 3, Branches: 1, Seed: 1})
	env.Git(repo, "pack-refs", "--all")
	tip := env.RevParse(repo, "branch0")
	time.Sleep(2 * repostate.RacyWindow) // stamps of older refs are kept
	c := &Checker{}
	unreachable := func() []string {
		t.Helper()
		out, _, err := c.Unreachable(context.Background(), repo, []string{tip})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for i := 0; i < 2; i++ {
		if got := unreachable(); got != nil {
			t.Fatalf("branch0's tip unreachable: %v", got)
		}
	}
	env.Git(repo, "update-ref", "-d", "refs/heads/branch0")
	if got := unreachable(); len(got) != 1 {
		t.Fatalf("the tip of a branch deleted just now is still servable")
	}
	time.Sleep(2 * repostate.RacyWindow)
	unreachable()
	env.Git(repo, "update-ref", "refs/heads/again", tip)
	if got := unreachable(); got != nil {
		t.Fatalf("the tip of a branch created just now is not servable: %v", got)
	}
}

// TestUnreachableHaves: of the haves, the commit and blob of a deleted
// branch are to be dropped, with a bitmap and without; a tip, an old
// commit main reaches and an id the repository lacks are not.
func TestUnreachableHaves(t *testing.T) {
	env := gittest.New(t)
	repo := filepath.Join(t.TempDir(), "r.git")
	env.Build(repo, gittest.Shape{Commits: 5, Branches: 1, Seed: 1})
	tip, old := env.RevParse(repo, "main"), env.RevParse(repo, "main~3")
	gitIn := func(input string, args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env, cmd.Stdin = repo, env.Vars, strings.NewReader(input)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return string(out)
	}
	// A commit with a file of its own that no ref reaches, as a deleted
	// branch's.
	blob := strings.TrimSpace(gitIn("the password is hunter2\n", "hash-object", "-w", "--stdin"))
	tree := strings.TrimSpace(gitIn("100644 blob "+blob+"\tsecret.txt\n", "mktree"))
	commit := strings.TrimSpace(env.Git(repo, "commit-tree", tree, "-p", tip, "-m", "oops"))
	missing := strings.Repeat("1", 40)
	for _, layout := range []string{"no bitmap", "bitmap"} {
		if layout == "bitmap" {
			env.Git(repo, "repack", "-adbq", "--keep-unreachable")
			if !hasBitmap(repo) {
				t.Fatal("repack wrote no bitmap")
			}
		}
		drop, _, err := (&Checker{}).UnreachableHaves(context.Background(), repo, []string{tip, old, commit, blob, missing})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(drop, " ") != commit+" "+blob {
			t.Errorf("%s: dropped %v, want the deleted branch's commit and blob", layout, drop)
		}
	}
}
