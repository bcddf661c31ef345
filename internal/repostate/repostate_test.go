package repostate

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"packwire/internal/gittest"
)

func stamp(t *testing.T, repo string) Stamp {
	t.Helper()
	s, err := Refs(repo, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// settled waits out the racy window and returns the stamp then.
func settled(t *testing.T, repo string) Stamp {
	t.Helper()
	time.Sleep(RacyWindow + 10*time.Millisecond)
	s := stamp(t, repo)
	if s.Racy {
		t.Fatal("still racy after the window")
	}
	return s
}

// TestRefsStampSeesEveryChange: each way git changes what a fetch sees
// gives a new stamp, and a stamp taken right after a change is racy.
func TestRefsStampSeesEveryChange(t *testing.T) {
	env := gittest.New(t)
	repo := filepath.Join(t.TempDir(), "r.git")
	env.Build(repo, gittest.Shape{Commits: 3, Branches: 1, Tags: 1, Seed: 1})
	env.Git(repo, "pack-refs", "--all")
	main := env.RevParse(repo, "main")
	first := env.RevParse(repo, "main~1")

	changes := []struct {
		name string
		do   func()
	}{
		{"nothing", func() {}},
		{"loose ref created", func() { env.Git(repo, "update-ref", "refs/heads/new", main) }},
		{"loose ref updated", func() { env.Git(repo, "update-ref", "refs/heads/new", first) }},
		{"loose ref updated back", func() { env.Git(repo, "update-ref", "refs/heads/new", main) }},
		{"packed ref updated", func() { env.Git(repo, "update-ref", "refs/heads/branch0", first) }},
		{"refs packed", func() { env.Git(repo, "pack-refs", "--all") }},
		{"packed ref deleted", func() { env.Git(repo, "update-ref", "-d", "refs/heads/new") }},
		{"nested ref created", func() { env.Git(repo, "update-ref", "refs/pull/1/head", main) }},
		{"HEAD moved", func() { env.Git(repo, "symbolic-ref", "HEAD", "refs/heads/branch0") }},
		{"config changed", func() { env.Git(repo, "config", "uploadpack.hideRefs", "refs/pull") }},
		{"shallow file", func() { os.WriteFile(filepath.Join(repo, "shallow"), []byte(first+"\n"), 0o644) }},
		{"objects repacked", func() { env.Git(repo, "repack", "-adq") }},
	}
	seen := map[string]string{}
	prev := settled(t, repo)
	for _, c := range changes {
		began := time.Now()
		c.do()
		// Racy for sure only if the change and the stamp both fell within
		// the window: on a loaded machine git alone can take longer.
		if st := stamp(t, repo); c.name != "nothing" && !st.Racy && time.Since(began) < RacyWindow {
			t.Errorf("%s: a stamp right after the change is not racy", c.name)
		}
		s := settled(t, repo)
		if c.name == "nothing" {
			if s.Digest != prev.Digest {
				t.Fatal("the stamp changed with nothing changed")
			}
			continue
		}
		if s.Digest == prev.Digest {
			t.Errorf("%s: same stamp", c.name)
		}
		if other, ok := seen[s.Digest]; ok {
			t.Errorf("%s: same stamp as after %s", c.name, other)
		}
		seen[s.Digest] = c.name
		prev = s
	}
	if _, err := Refs(filepath.Join(t.TempDir(), "missing.git"), time.Now()); err == nil {
		t.Error("a missing repository has a stamp")
	}
}

func TestConfigStamp(t *testing.T) {
	dir := t.TempDir()
	global := filepath.Join(t.TempDir(), "gitconfig")
	t.Setenv("GIT_CONFIG_GLOBAL", global)
	config := func() Stamp {
		t.Helper()
		time.Sleep(RacyWindow + 10*time.Millisecond)
		s := Config(dir, time.Now())
		if s.Racy {
			t.Fatal("still racy after the window")
		}
		return s
	}
	none := config()
	os.WriteFile(filepath.Join(dir, "config"), []byte("[core]\n"), 0o644)
	if Config(dir, time.Now()).Racy != true {
		t.Fatal("a config written just now is not racy")
	}
	a := config()
	if a == none {
		t.Fatal("a new config has the stamp of none")
	}
	os.WriteFile(filepath.Join(dir, "config"), []byte("[core]\n\tbare = true\n"), 0o644)
	b := config()
	if b == a {
		t.Fatal("a changed config has the same stamp")
	}
	os.WriteFile(global, []byte("[uploadpack]\n\tallowFilter = true\n"), 0o644)
	if config() == b {
		t.Fatal("a changed global config has the same stamp")
	}
}

// TestKeptStampSeesEveryChangeAtOnce: a stamp taken right after a change
// (no wait) differs from the one before it, though stamps are kept
// between calls: on Linux, asking again with nothing changed walks
// nothing.
func TestKeptStampSeesEveryChangeAtOnce(t *testing.T) {
	env := gittest.New(t)
	repo := filepath.Join(t.TempDir(), "r.git")
	env.Build(repo, gittest.Shape{Commits: 3, Branches: 1, Tags: 1, Seed: 1})
	env.Git(repo, "pack-refs", "--all")
	main := env.RevParse(repo, "main")
	first := env.RevParse(repo, "main~1")
	changes := []struct {
		name string
		do   func()
	}{
		{"loose ref created", func() { env.Git(repo, "update-ref", "refs/heads/new", main) }},
		{"loose ref updated", func() { env.Git(repo, "update-ref", "refs/heads/new", first) }},
		{"packed ref updated", func() { env.Git(repo, "update-ref", "refs/heads/branch0", first) }},
		{"refs packed", func() { env.Git(repo, "pack-refs", "--all") }},
		{"nested ref created", func() { env.Git(repo, "update-ref", "refs/pull/1/head", main) }},
		{"nested ref updated", func() { env.Git(repo, "update-ref", "refs/pull/1/head", first) }},
		{"ref deleted", func() { env.Git(repo, "update-ref", "-d", "refs/pull/1/head") }},
		{"HEAD moved", func() { env.Git(repo, "symbolic-ref", "HEAD", "refs/heads/branch0") }},
		{"config changed", func() { env.Git(repo, "config", "uploadpack.hideRefs", "refs/pull") }},
		{"shallow file", func() { os.WriteFile(filepath.Join(repo, "shallow"), []byte(first+"\n"), 0o644) }},
		{"alternates", func() {
			os.MkdirAll(filepath.Join(repo, "objects", "info"), 0o755)
			os.WriteFile(filepath.Join(repo, "objects", "info", "alternates"), []byte("/nowhere\n"), 0o644)
		}},
		{"objects repacked", func() { env.Git(repo, "repack", "-adq") }},
	}
	prev := settled(t, repo)
	for _, c := range changes {
		before := walks.Load()
		if again := stamp(t, repo); again.Digest != prev.Digest {
			t.Fatalf("before %s: the stamp changed with nothing changed", c.name)
		}
		if runtime.GOOS == "linux" && walks.Load() != before {
			t.Errorf("before %s: a stamp with nothing changed walked the repository", c.name)
		}
		c.do()
		now := stamp(t, repo)
		if now.Digest == prev.Digest {
			t.Errorf("%s: the stamp right after it is the one before", c.name)
		}
		prev = settled(t, repo)
	}
}

// TestKeptStampSeesARepositoryReplaced: a parent directory renamed away
// and another repository moved to the same path sends no event to the
// watches inside it; the stamp must still be the new repository's.
func TestKeptStampSeesARepositoryReplaced(t *testing.T) {
	env := gittest.New(t)
	root := t.TempDir()
	path := filepath.Join(root, "team", "app.git")
	env.Build(path, gittest.Shape{Commits: 3, Branches: 1, Seed: 1})
	other := filepath.Join(root, "other", "app.git")
	env.Build(other, gittest.Shape{Commits: 5, Branches: 2, Seed: 2})
	first := settled(t, path)
	if again := stamp(t, path); again.Digest != first.Digest {
		t.Fatal("the stamp changed with nothing changed")
	}
	if err := os.Rename(filepath.Join(root, "team"), filepath.Join(root, "team-old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(root, "other"), filepath.Join(root, "team")); err != nil {
		t.Fatal(err)
	}
	if now := stamp(t, path); now.Digest == first.Digest {
		t.Fatal("another repository at the same path has the old one's stamp")
	}
}
