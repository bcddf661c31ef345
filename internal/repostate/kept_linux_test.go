package repostate

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"packwire/internal/gittest"
)

// keptEntry is the kept stamp of repo, after a call has made one.
func keptEntry(t *testing.T, repo string) *keptStamp {
	t.Helper()
	kept.mu.Lock()
	defer kept.mu.Unlock()
	k := kept.repos[repo]
	if k == nil {
		t.Fatalf("no kept stamp for %s", repo)
	}
	return k
}

// TestKeptWatchesStayWithinBudget: the watch budget holds during a walk,
// not only when a repository is first seen: one with many ref
// directories stops being watched (and is walked on every call) instead
// of taking every watch; its stamp is still right.
func TestKeptWatchesStayWithinBudget(t *testing.T) {
	env := gittest.New(t)
	repo := filepath.Join(t.TempDir(), "r.git")
	env.Build(repo, gittest.Shape{Commits: 2, Seed: 1})
	main := env.RevParse(repo, "main")
	for i := range 30 {
		env.Git(repo, "update-ref", fmt.Sprintf("refs/pull/%d/head", i), main)
	}
	Refs(t.TempDir(), time.Now()) // sets the package up (no repository there)
	kept.mu.Lock()
	saved := kept.budget
	kept.budget = len(kept.byWatch) + 10
	budget := kept.budget
	kept.mu.Unlock()
	t.Cleanup(func() { kept.mu.Lock(); kept.budget = saved; kept.mu.Unlock() })

	got := settled(t, repo)
	want, _, err := walkRefs(repo, time.Now(), nil)
	if err != nil || got.Digest != want.Digest {
		t.Fatalf("stamp %s, walked %s (%v)", got.Digest, want.Digest, err)
	}
	kept.mu.Lock()
	watches := len(kept.byWatch)
	kept.mu.Unlock()
	if watches > budget {
		t.Fatalf("%d watches held, budget %d", watches, budget)
	}
	if k := keptEntry(t, repo); !k.unwatched {
		t.Fatal("a repository past the budget is still counted as watched")
	}
	env.Git(repo, "update-ref", "refs/pull/0/head", env.RevParse(repo, "main~1"))
	if now := stamp(t, repo); now.Digest == got.Digest {
		t.Fatal("an unwatched repository's stamp missed a change")
	}
}

// TestKeptWatchesFollowDirectories: ref directories created and removed
// again and again (branches pushed and deleted) leave no watch behind
// in the repository's list.
func TestKeptWatchesFollowDirectories(t *testing.T) {
	env := gittest.New(t)
	repo := filepath.Join(t.TempDir(), "r.git")
	env.Build(repo, gittest.Shape{Commits: 2, Seed: 1})
	main := env.RevParse(repo, "main")
	stamp(t, repo)
	start := len(keptEntry(t, repo).wds)
	for i := range 40 {
		ref := fmt.Sprintf("refs/heads/feature-%d/x", i)
		env.Git(repo, "update-ref", ref, main)
		stamp(t, repo)
		env.Git(repo, "update-ref", "-d", ref) // git removes the emptied directory
		stamp(t, repo)
	}
	if _, err := os.Stat(filepath.Join(repo, "refs", "heads", "feature-0")); err == nil {
		t.Skip("this git keeps emptied ref directories")
	}
	if n := len(keptEntry(t, repo).wds); n > start+1 {
		t.Fatalf("%d watches listed after 40 directories came and went (%d before)", n, start)
	}
}

// TestKeptStampSurvivesPackWrites: a pack being written in objects/pack
// (tens of thousands of writes during a push or a repack) queues no event
// per write: the queue does not overflow (which would drop every kept
// stamp) and the stamp stays kept; the pack's arrival by rename is seen.
func TestKeptStampSurvivesPackWrites(t *testing.T) {
	env := gittest.New(t)
	repo := filepath.Join(t.TempDir(), "r.git")
	env.Build(repo, gittest.Shape{Commits: 2, Seed: 1})
	tmp := filepath.Join(repo, "objects", "pack", "tmp_pack_test")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first := settled(t, repo)
	kept.mu.Lock()
	overflows := kept.overflow
	kept.mu.Unlock()
	walked := walks.Load()
	for range 20000 { // more than the default fs.inotify.max_queued_events
		if _, err := f.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
	}
	if again := stamp(t, repo); again.Digest != first.Digest {
		t.Fatal("writes to a temporary pack changed the stamp")
	}
	kept.mu.Lock()
	overflowed := kept.overflow != overflows
	kept.mu.Unlock()
	if overflowed || walks.Load() != walked {
		t.Fatalf("writes to a temporary pack: queue overflowed %v, walks %d -> %d", overflowed, walked, walks.Load())
	}
	f.Close()
	if err := os.Rename(tmp, filepath.Join(repo, "objects", "pack", "pack-test.pack")); err != nil {
		t.Fatal(err)
	}
	if now := stamp(t, repo); now.Digest == first.Digest {
		t.Fatal("a pack renamed into place did not change the stamp")
	}
}
