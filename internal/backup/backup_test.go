package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/gittest"
	"packwire/internal/lfs"
	"packwire/internal/maintain"
	"packwire/internal/repo"
	"packwire/internal/store"
)

// makeData makes an empty data directory, as packwire serve does on its
// first start.
func makeData(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(filepath.Join(dir, "repos"), 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), filepath.Join(dir, storeFile))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	return dir
}

// newData makes a data directory with repository app (history, branches,
// tags, a loose object) and returns it.
func newData(t *testing.T, env *gittest.Env) (*datadir.Data, repo.Repo) {
	t.Helper()
	data, err := datadir.Open(context.Background(), makeData(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { data.Close() })
	r, err := data.Repos.Create(context.Background(), "team/app")
	if err != nil {
		t.Fatal(err)
	}
	env.Build(r.Path, gittest.Shape{Commits: 10, Branches: 2, Tags: 2, Seed: 1})
	return data, r
}

// A push that lands after a repository's refs were read is not in its
// backup, and everything the read refs reach is (objects are copied after
// the refs, and pushes write objects before refs).
func TestPushBetweenRefsAndObjects(t *testing.T) {
	env := gittest.New(t)
	data, r := newData(t, env)
	before := env.Git(r.Path, "show-ref")
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", r.Path, w)
	env.Git(w, "commit", "-q", "--allow-empty", "-m", "during the backup")
	afterRefs = func(repo.Repo) {
		// A local push: receive-pack unpacks it as loose objects.
		env.Git(w, "push", "-q", "origin", "HEAD:main", "HEAD:refs/heads/new")
	}
	defer func() { afterRefs = nil }()
	out := filepath.Join(t.TempDir(), "out")
	m, stats, err := Create(context.Background(), data.Dir, out, Options{Version: "test", Copy: true})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Linked != 0 || stats.Copied == 0 {
		t.Fatalf("--copy linked files: %+v", stats)
	}
	dir := filepath.Join(out, "repos", "team", "app.git")
	env.Fsck(dir)
	if got := env.Git(dir, "show-ref"); got != before {
		t.Fatalf("backup refs:\n%s\nwant the refs before the push:\n%s", got, before)
	}
	if len(m.Repositories) != 1 || m.Repositories[0].Refs != strings.Count(before, "\n") || m.Repositories[0].Head != "ref: refs/heads/main" {
		t.Fatalf("manifest: %+v", m)
	}
}

// A backup waits for a maintenance run on a repository to end: maintenance
// is what deletes packs.
func TestBackupWaitsForMaintenance(t *testing.T) {
	env := gittest.New(t)
	data, r := newData(t, env)
	unlock, err := maintain.Lock(r.Path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := Create(context.Background(), data.Dir, filepath.Join(t.TempDir(), "out"), Options{})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("backup ended while maintenance held the repository: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	unlock()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("backup still waiting 20s after maintenance ended")
	}
}

// Restore rebuilds what the backup holds: the store with its users, the
// repositories with their refs; objects hard-linked, the database copied.
func TestRestore(t *testing.T) {
	env := gittest.New(t)
	data, r := newData(t, env)
	ctx := context.Background()
	if _, err := data.Store.AddUser(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := repo.SetDescription(r, "the app"); err != nil {
		t.Fatal(err)
	}
	// An LFS object of team/app.
	ls, err := lfs.Open(ctx, data.Dir)
	if err != nil {
		t.Fatal(err)
	}
	content := []byte("an LFS object\n")
	sum := sha256.Sum256(content)
	oid := hex.EncodeToString(sum[:])
	if _, err := ls.Objects.Put(oid, int64(len(content)), bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if err := ls.Index.Add(ctx, r.Name, oid, int64(len(content))); err != nil {
		t.Fatal(err)
	}
	ls.Close()
	out := filepath.Join(t.TempDir(), "out")
	if _, _, err := Create(ctx, data.Dir, out, Options{}); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "restored")
	if err := os.Mkdir(target, 0o755); err != nil { // an empty directory is fine
		t.Fatal(err)
	}
	_, stats, err := Restore(ctx, out, target, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if stats.Linked == 0 {
		t.Fatalf("nothing hard-linked on one file system: %+v", stats)
	}
	got, err := datadir.Open(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if _, err := got.Store.GetUser(ctx, "alice"); err != nil {
		t.Fatalf("user after restore: %v", err)
	}
	r2, err := got.Repos.Resolve("team/app")
	if err != nil {
		t.Fatal(err)
	}
	env.Fsck(r2.Path)
	if a, b := env.Git(r.Path, "show-ref", "--head"), env.Git(r2.Path, "show-ref", "--head"); a != b {
		t.Fatalf("refs after restore:\n%s\nwant:\n%s", b, a)
	}
	if d := repo.Description(r2); d != "the app" {
		t.Fatalf("description after restore: %q", d)
	}
	if n, size, err := lfs.RepoUsage(ctx, target, "team/app"); err != nil || n != 1 || size != int64(len(content)) {
		t.Fatalf("LFS after restore: %d objects, %d bytes (%v)", n, size, err)
	}
	if got, err := os.ReadFile((&lfs.Disk{Dir: lfs.Dir(target)}).Path(oid)); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("LFS object after restore: %q (%v)", got, err)
	}
	if _, _, err := Restore(ctx, out, target, Options{}); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("restore into a data directory: %v", err)
	}
}
