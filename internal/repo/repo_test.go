package repo

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCleanName(t *testing.T) {
	good := map[string]string{
		"app": "app", "/app.git": "app", "team/app": "team/app", "/team/app.git/": "team/app",
		"a_b-c.d": "a_b-c.d",
	}
	for in, want := range good {
		got, err := CleanName(in)
		if err != nil || got != want {
			t.Errorf("CleanName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := []string{"", "/", "..", "../x", "a/../b", "a/./b", "a//b", ".git", "a/.hidden", "~root/x",
		"a b", "a;id", "a'b", "a\x00b", "%2e%2e", "a\\b", "-upload", "a.git/b", "a/b\n",
		// The dashboard lives under /-/: no repository name may start with "-".
		"-", "-/now", "/-/now", "-/lab/x", "team/-x"}
	for _, in := range bad {
		if got, err := CleanName(in); !errors.Is(err, ErrInvalidName) {
			t.Errorf("CleanName(%q) = %q, %v; want ErrInvalidName", in, got, err)
		}
	}
}

func TestResolveRefusesEscapes(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is not installed: run scripts/install-deps")
	}
	base := t.TempDir()
	root := Root{Dir: filepath.Join(base, "repos")}
	os.MkdirAll(root.Dir, 0o755)
	ctx := context.Background()
	if _, err := root.Create(ctx, "team/app"); err != nil {
		t.Fatal(err)
	}
	// A bare repository outside the root, reachable only through a symlink.
	outside := filepath.Join(base, "secret.git")
	if err := exec.Command("git", "init", "--bare", "-q", outside).Run(); err != nil {
		t.Fatal(err)
	}
	os.Symlink(outside, filepath.Join(root.Dir, "escape.git"))
	// A symlink that stays inside the root is fine.
	os.Symlink(root.PathFor("team/app"), filepath.Join(root.Dir, "alias.git"))
	// A non-bare directory.
	os.MkdirAll(filepath.Join(root.Dir, "worktree", ".git"), 0o755)
	exec.Command("git", "init", "-q", filepath.Join(root.Dir, "worktree")).Run()

	if r, err := root.Resolve("/team/app.git"); err != nil || r.Name != "team/app" {
		t.Fatalf("Resolve: %v %v", r, err)
	}
	if _, err := root.Resolve("team/app"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.Resolve("alias"); err != nil {
		t.Fatalf("in-root symlink: %v", err)
	}
	for _, name := range []string{"escape", "worktree", "worktree/.git", "missing", "../secret", outside} {
		if _, err := root.Resolve(name); err == nil {
			t.Errorf("Resolve(%q) succeeded", name)
		}
	}
	if _, err := root.Create(ctx, "team/app"); !errors.Is(err, ErrExists) {
		t.Errorf("duplicate create: %v", err)
	}
	if _, err := root.Create(ctx, "team/app/inner"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("nested create: %v", err)
	}
	list, err := root.List()
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, r := range list {
		names = append(names, r.Name)
	}
	if len(names) != 1 || names[0] != "team/app" {
		t.Errorf("List = %v", names)
	}
}

// FuzzCleanName: whatever a client sends, an accepted name is a clean
// relative path that cannot leave the repository root.
func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"team/app.git", "/../x", "a/./b", "~x", "a\x00b", "%2e%2e/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		name, err := CleanName(raw)
		if err != nil {
			return
		}
		if filepath.IsAbs(name) || filepath.Clean(name) != name || strings.HasPrefix(name, ".") {
			t.Fatalf("CleanName(%q) = %q", raw, name)
		}
		for _, seg := range strings.Split(name, "/") {
			if seg == ".." || seg == "." || seg == "" || strings.ContainsAny(seg, "\x00\\%~ \n'\"$;|&`") {
				t.Fatalf("CleanName(%q) = %q", raw, name)
			}
		}
	})
}

// TestRemoveStaleLocks: lock files older than the cut are removed (a
// killed git's), newer ones (a running git's) and refs stay.
func TestRemoveStaleLocks(t *testing.T) {
	root := Root{Dir: t.TempDir()}
	r, err := root.Create(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	for _, f := range []string{"refs/heads/main.lock", "refs/heads/team/x.lock", "packed-refs.lock", "HEAD.lock"} {
		p := filepath.Join(r.Path, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, nil, 0o644)
		os.Chtimes(p, old, old)
	}
	fresh := filepath.Join(r.Path, "refs", "heads", "busy.lock")
	os.WriteFile(fresh, nil, 0o644)
	ref := filepath.Join(r.Path, "refs", "heads", "kept")
	os.WriteFile(ref, []byte("x\n"), 0o644)
	os.Chtimes(ref, old, old)
	n, err := RemoveStaleLocks(r, time.Now().Add(-time.Minute))
	if err != nil || n != 4 {
		t.Fatalf("removed %d, %v; want 4", n, err)
	}
	for _, keep := range []string{fresh, ref} {
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("%s removed", keep)
		}
	}
}
