package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/gittest"
)

// TestCopyDigestIsGits: the digest read from a copy's files is the one of
// its refs as git lists them (for-each-ref): loose and packed refs, a
// loose ref over a packed one, annotated tags (their peeled lines left
// out), a symbolic ref as its target's id; the nodes' own refs and
// lock files (a transaction in progress) left out.
func TestCopyDigestIsGits(t *testing.T) {
	env := gittest.New(t)
	work := filepath.Join(t.TempDir(), "w")
	env.Git("", "init", "-q", "-b", "main", work)
	env.Git(work, "commit", "-q", "--allow-empty", "-m", "one")
	one := env.RevParse(work, "HEAD")
	env.Git(work, "tag", "-a", "-m", "v1", "v1")
	env.Git(work, "branch", "old")
	env.Git(work, "pack-refs", "--all")
	env.Git(work, "commit", "-q", "--allow-empty", "-m", "two")
	env.Git(work, "branch", "new")
	env.Git(work, "update-ref", "refs/packwire/mine", one)
	env.Git(work, "symbolic-ref", "refs/heads/alias", "refs/heads/old")
	gitDir := filepath.Join(work, ".git")
	os.WriteFile(filepath.Join(gitDir, "refs", "heads", "locked.lock"), []byte(one+"\n"), 0o644)

	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(env.Git(work, "for-each-ref", "--format=%(refname) %(objectname)")), "\n") {
		name, id, _ := strings.Cut(line, " ")
		if !strings.HasPrefix(name, LocalRefs) {
			want[name] = id
		}
	}
	got, err := CopyRefs(gitDir)
	if err != nil {
		t.Fatal(err)
	}
	if RefDigest(got) != RefDigest(want) || len(got) != 5 {
		t.Fatalf("refs read from the files:\n%v\ngit's:\n%v", got, want)
	}
	if d, _ := CopyDigest(gitDir); d != RefDigest(want) {
		t.Fatal("CopyDigest differs from RefDigest(CopyRefs)")
	}
	// A push's updates applied give the digest of the refs after it.
	after := Apply(got, []Update{{Ref: "refs/heads/new", New: strings.Repeat("0", 40)}, {Ref: "refs/heads/x", New: one}})
	env.Git(work, "update-ref", "-d", "refs/heads/new")
	env.Git(work, "update-ref", "refs/heads/x", one)
	if d, _ := CopyDigest(gitDir); d != RefDigest(after) {
		t.Fatalf("after the updates: %s, want %s", d, RefDigest(after))
	}
	if EmptyDigest != RefDigest(map[string]string{}) {
		t.Fatal("EmptyDigest")
	}
}
