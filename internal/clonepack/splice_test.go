package clonepack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"packwire/internal/gittest"
	"packwire/internal/maintain"
	"packwire/internal/pktline"
	"packwire/internal/repo"
)

// servedTips are the distinct ids of branches, tags and HEAD: what a
// clone wants.
func servedTips(e *gittest.Env, bare string) []string {
	var tips []string
	for _, line := range strings.Split(strings.TrimSpace(e.Git(bare, "for-each-ref", "--format=%(objectname) %(refname)", "refs/heads", "refs/tags")), "\n") {
		if id, _, ok := strings.Cut(line, " "); ok {
			tips = append(tips, id)
		}
	}
	return distinct(append(tips, e.RevParse(bare, "HEAD")))
}

// unframe returns the pack a v2 answer carries in its side band.
func unframe(t *testing.T, answer []byte) []byte {
	t.Helper()
	r := pktline.NewReader(bytes.NewReader(answer))
	if _, line, err := r.Read(); err != nil || string(line) != "packfile\n" {
		t.Fatalf("first packet %q %v", line, err)
	}
	var pack []byte
	for {
		kind, line, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		if kind == pktline.Flush {
			return pack
		}
		pack = append(pack, line[1:]...)
	}
}

// checkPack indexes pack with `git index-pack --strict` into a new
// repository, points refs at tips there and checks it with fsck --full;
// its objects must be exactly those the tips reach in bare.
func checkPack(t *testing.T, e *gittest.Env, bare string, tips []string, pack []byte) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "dst.git")
	e.Git("", "init", "-q", "--bare", dst)
	cmd := exec.Command("git", "index-pack", "--strict", "--stdin")
	cmd.Dir, cmd.Env, cmd.Stdin = dst, e.Vars, bytes.NewReader(pack)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("index-pack --strict: %v\n%s", err, out)
	}
	var refs strings.Builder
	for i, tip := range tips {
		fmt.Fprintf(&refs, "update refs/tips/%d %s\n", i, tip)
	}
	cmd = exec.Command("git", "update-ref", "--stdin")
	cmd.Dir, cmd.Env, cmd.Stdin = dst, e.Vars, strings.NewReader(refs.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("update-ref: %v\n%s", err, out)
	}
	if out, err := e.Run(dst, nil, "fsck", "--full", "--strict", "--no-dangling"); err != nil {
		t.Fatalf("fsck: %v\n%s", err, out)
	}
	got := strings.Fields(e.Git(dst, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)"))
	var want []string
	for _, line := range strings.Split(strings.TrimSpace(e.Git(bare, append([]string{"rev-list", "--objects"}, tips...)...)), "\n") {
		want = append(want, strings.Fields(line)[0])
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the spliced pack has %d objects, the tips reach %d", len(got), len(want))
	}
}

// TestSpliceRandomPushes: after a full maintenance run, 50 random pushes
// (commits, new branches, merges, annotated and lightweight tags), each
// followed by a clone's answer spliced from the preferred pack and a thin
// pack: each is a pack `git index-pack --strict` takes, fsck-clean, with
// exactly the objects the tips reach. Before them, a rewound branch or a
// deleted tag leaves the pack holding what no clone wants: no splice.
func TestSpliceRandomPushes(t *testing.T) {
	e := gittest.New(t)
	bare := filepath.Join(t.TempDir(), "app.git")
	e.Build(bare, gittest.Shape{Commits: 20, Files: 10, BlobBytes: 3000, Branches: 2, Tags: 2, Seed: 3})
	e.Git(bare, "branch", "merged", "main~2") // deleted later: its tip stays in main
	ctx := context.Background()
	if _, err := maintain.New(maintain.Options{Nice: -1}).Run(ctx, repo.Repo{Name: "app", Path: bare}, maintain.Full, "test"); err != nil {
		t.Fatal(err)
	}
	none := func() error { return nil }
	spliceNow := func() error {
		_, err := OpenSplice(ctx, bare, Clone{Wants: servedTips(e, bare), V2: true, Band: pktline.MaxLength}, none)
		return err
	}
	// A rewound branch, a deleted tag, a tag moved: the pack holds
	// objects no clone wants any more.
	branchTip, tag := e.RevParse(bare, "branch0"), e.RevParse(bare, "refs/tags/v0")
	e.Git(bare, "update-ref", "refs/heads/branch0", "branch0~1") // its tip was its own
	if err := spliceNow(); !errors.Is(err, ErrNotClone) {
		t.Fatalf("spliced with a branch rewound: %v", err)
	}
	e.Git(bare, "update-ref", "-d", "refs/heads/branch0")
	if err := spliceNow(); !errors.Is(err, ErrNotClone) {
		t.Fatalf("spliced with a branch deleted: %v", err)
	}
	e.Git(bare, "update-ref", "refs/heads/branch0", branchTip)
	e.Git(bare, "tag", "-d", "v0") // annotated: its tag object is in the pack
	if err := spliceNow(); !errors.Is(err, ErrNotClone) {
		t.Fatalf("spliced with a tag deleted: %v", err)
	}
	e.Git(bare, "tag", "v0", "main") // a lightweight tag now: the tag object is still unwanted
	if err := spliceNow(); !errors.Is(err, ErrNotClone) {
		t.Fatalf("spliced with a tag object no longer wanted: %v", err)
	}
	e.Git(bare, "update-ref", "refs/tags/v0", tag)
	// A branch deleted whose tip another want reaches: git proves it
	// (a second run), and the pack is still all wanted.
	merged := e.RevParse(bare, "merged")
	e.Git(bare, "branch", "-D", "merged")
	tips := servedTips(e, bare)
	clone := Clone{Wants: tips, V2: true, Band: pktline.MaxLength}
	sp, err := OpenSplice(ctx, bare, clone, none)
	if err != nil {
		t.Fatalf("no splice with a merged branch deleted: %v", err)
	}
	var answer bytes.Buffer
	if _, err := sp.WriteResponse(&answer, clone); err != nil {
		t.Fatal(err)
	}
	sp.Close()
	if sp.GitRuns != 2 {
		t.Fatalf("a merged branch deleted: %d git runs, want 2 (the thin pack, the walk)", sp.GitRuns)
	}
	checkPack(t, e, bare, tips, unframe(t, answer.Bytes()))
	e.Git(bare, "branch", "merged", merged)
	work := filepath.Join(t.TempDir(), "work")
	e.Git("", "clone", "-q", bare, work)
	rng := rand.New(rand.NewPCG(32, 1))
	branches := []string{"main"}
	for i := range 50 {
		op := rng.IntN(10)
		switch {
		case op < 5: // a commit on a branch
			b := branches[rng.IntN(len(branches))]
			e.Git(work, "checkout", "-q", "-B", b, "origin/"+b)
			for f := range 1 + rng.IntN(3) {
				name := fmt.Sprintf("%s-f%d.txt", b, rng.IntN(12)) // a file per branch: merges never conflict
				writeFile(t, filepath.Join(work, name), fmt.Sprintf("push %d file %d %s\n", i, f, strings.Repeat("x", rng.IntN(4000))))
				e.Git(work, "add", name)
			}
			e.Git(work, "commit", "-qm", fmt.Sprintf("push %d", i))
			e.Git(work, "push", "-q", "origin", b)
		case op < 7: // a new branch with a commit
			b := fmt.Sprintf("topic%d", i)
			e.Git(work, "checkout", "-q", "-B", b, "origin/main")
			writeFile(t, filepath.Join(work, b+".txt"), b+"\n")
			e.Git(work, "add", b+".txt")
			e.Git(work, "commit", "-qm", b)
			e.Git(work, "push", "-q", "origin", b)
			branches = append(branches, b)
		case op < 8 && len(branches) > 1: // a merge into main
			b := branches[1+rng.IntN(len(branches)-1)]
			e.Git(work, "checkout", "-q", "-B", "main", "origin/main")
			e.Git(work, "merge", "-q", "--no-ff", "--no-edit", "origin/"+b)
			e.Git(work, "push", "-q", "origin", "main")
		case op < 9: // an annotated tag
			e.Git(work, "tag", "-a", "-m", fmt.Sprintf("tag %d", i), fmt.Sprintf("a%d", i), "origin/"+branches[rng.IntN(len(branches))])
			e.Git(work, "push", "-q", "origin", fmt.Sprintf("a%d", i))
		default: // a lightweight tag
			e.Git(work, "tag", fmt.Sprintf("l%d", i), "origin/"+branches[rng.IntN(len(branches))])
			e.Git(work, "push", "-q", "origin", fmt.Sprintf("l%d", i))
		}
		tips := servedTips(e, bare)
		clone := Clone{Wants: tips, V2: true, Band: pktline.MaxLength}
		sp, err := OpenSplice(ctx, bare, clone, none)
		if err != nil {
			t.Fatalf("push %d: no splice: %v", i, err)
		}
		var answer bytes.Buffer
		if _, err := sp.WriteResponse(&answer, clone); err != nil {
			t.Fatal(err)
		}
		sp.Close()
		if sp.UserCPU+sp.SysCPU == 0 {
			t.Fatalf("push %d: the splice's git cost nothing", i)
		}
		// Each old tip is still wanted or a parent of a commit the thin
		// pack carries: one git run, no walk of the old tips.
		if sp.GitRuns != 1 {
			t.Fatalf("push %d (op %d): %d git runs, want 1", i, op, sp.GitRuns)
		}
		checkPack(t, e, bare, tips, unframe(t, answer.Bytes()))
	}

}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestThinParentsThroughDeltas: pack-objects stores most of a push's
// commits as deltas against each other; thinParents rebuilds them and
// finds every parent, the old tip's included, as git lists them.
func TestThinParentsThroughDeltas(t *testing.T) {
	e := gittest.New(t)
	work := filepath.Join(t.TempDir(), "work")
	e.Git("", "init", "-q", work)
	body := strings.Repeat("a long message body that every commit of this push shares\n", 20)
	for i := range 9 {
		writeFile(t, filepath.Join(work, "f.txt"), fmt.Sprintf("version %d\n", i))
		e.Git(work, "add", "f.txt")
		e.Git(work, "commit", "-qm", fmt.Sprintf("commit %d\n\n%s", i, body))
	}
	cmd := exec.Command("git", "pack-objects", "--stdout", "--thin", "--revs", "--delta-base-offset", "-q")
	cmd.Dir, cmd.Env, cmd.Stdin = work, e.Vars, strings.NewReader("HEAD\n^HEAD~8\n")
	pack, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	// The commits must be deltas, or this tests nothing.
	idx := filepath.Join(t.TempDir(), "p.pack")
	writeFile(t, idx, string(pack))
	e.Git(work, "index-pack", idx)
	deltas := 0
	for _, line := range strings.Split(e.Git(work, "verify-pack", "-v", idx), "\n") {
		if f := strings.Fields(line); len(f) > 6 && f[1] == "commit" {
			deltas++
		}
	}
	if deltas == 0 {
		t.Fatal("pack-objects stored no commit as a delta")
	}
	var want []string
	for _, line := range strings.Split(strings.TrimSpace(e.Git(work, "rev-list", "--parents", "HEAD~8..HEAD")), "\n") {
		want = append(want, strings.Fields(line)[1:]...)
	}
	got := thinParents(pack)
	if len(got) != len(want) {
		t.Fatalf("found %d parents, want %d (%d commits stored as deltas)", len(got), len(want), deltas)
	}
	for _, p := range want {
		if !got[p] {
			t.Fatalf("parent %s not found", p)
		}
	}
}
