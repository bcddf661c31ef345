package maintain

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A full run writes a clone bundle that git 2.39 takes as it takes one of
// `git bundle create`: verify lists the branches, tags and HEAD with no
// prerequisites, a clone from it is complete and fsck-clean and has exactly
// the objects of the preferred pack; a repository emptied of refs loses it.
func TestFullRunWritesCloneBundle(t *testing.T) {
	t.Parallel()
	env, r := newRepo(t)
	m := quietMaintainer()
	ctx := context.Background()
	if _, err := m.Maintain(ctx, r, true); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(r.Path, BundleFile)
	out := env.Git("", "bundle", "verify", bundle)
	if strings.Contains(out, "requires") && !strings.Contains(out, "requires no") {
		t.Fatalf("bundle has prerequisites:\n%s", out)
	}
	heads := env.Git("", "bundle", "list-heads", bundle)
	refs := env.Git(r.Path, "for-each-ref", "--format=%(objectname) %(refname)", "refs/heads", "refs/tags")
	for _, line := range strings.Split(strings.TrimSpace(refs), "\n") {
		if !strings.Contains(heads, line+"\n") {
			t.Fatalf("bundle heads lack %q:\n%s", line, heads)
		}
	}
	if strings.Contains(heads, "refs/pull/") {
		t.Fatalf("bundle names refs outside branches and tags:\n%s", heads)
	}
	w := filepath.Join(t.TempDir(), "w.git")
	env.Git("", "clone", "-q", "--bare", bundle, w)
	env.Fsck(w)
	st, err := ReadState(r.Path)
	if err != nil || st == nil {
		t.Fatalf("state %v %v", st, err)
	}
	pack := packObjects(t, env, r.Path, st.Preferred)
	got := strings.Fields(env.Git(w, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)"))
	if strings.Join(got, " ") != strings.Join(pack, " ") {
		t.Fatalf("clone from the bundle has %d objects, the preferred pack %d", len(got), len(pack))
	}
	if _, err := os.Stat(bundle + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary bundle left behind: %v", err)
	}

	// No branches or tags left: nothing to clone, no bundle.
	for _, ref := range strings.Split(strings.TrimSpace(env.Git(r.Path, "for-each-ref", "--format=%(refname)", "refs/heads", "refs/tags")), "\n") {
		env.Git(r.Path, "update-ref", "-d", ref)
	}
	if _, err := m.Maintain(ctx, r, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bundle); !os.IsNotExist(err) {
		t.Fatalf("bundle of a repository without refs: %v", err)
	}
}

// TestNoBundleWritesNone: with bundle URIs off (serve --bundle-uris=false)
// a full run keeps no second copy of the preferred pack, and removes the
// bundle an earlier run wrote.
func TestNoBundleWritesNone(t *testing.T) {
	t.Parallel()
	_, r := newRepo(t)
	ctx := context.Background()
	bundle := filepath.Join(r.Path, BundleFile)
	if _, err := quietMaintainer().Maintain(ctx, r, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bundle); err != nil {
		t.Fatalf("the first run wrote no bundle: %v", err)
	}
	m := quietMaintainer()
	m.NoBundle = true
	if _, err := m.Maintain(ctx, r, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bundle); !os.IsNotExist(err) {
		t.Fatalf("NoBundle left the clone bundle: %v", err)
	}
	if st, err := ReadState(r.Path); err != nil || st == nil {
		t.Fatalf("state %v %v: the preferred pack must still be recorded", st, err)
	}
}
