package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/repo"
)

// TestDefaultBranch: a new repository's HEAD names main, so the README's
// "push main" gives clones a checked-out tree and archive --remote HEAD
// works; when the first push brings other branches, HEAD follows it (main
// if pushed, else the only one, else the first), and never moves once its
// branch exists.
func TestDefaultBranch(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	ctx := context.Background()
	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "init", "-q", "-b", "trunk", w)
	os.WriteFile(filepath.Join(w, "README"), []byte("hello\n"), 0o644)
	s.env.Git(w, "add", "README")
	s.env.Git(w, "commit", "-qm", "first")
	s.env.Git(w, "branch", "feature")
	s.env.Git(w, "branch", "main")
	s.env.Git(w, "branch", "zeta")

	cases := []struct {
		name     string
		push     []string
		wantHead string
	}{
		{"readme", []string{"HEAD:refs/heads/main"}, "main"},
		{"only-trunk", []string{"trunk"}, "trunk"},
		{"with-main", []string{"feature", "main", "zeta"}, "main"},
		{"first-of-many", []string{"zeta", "feature"}, "zeta"},
	}
	for _, c := range cases {
		r, err := s.Data.Repos.Create(ctx, "team/"+c.name)
		if err != nil {
			t.Fatal(err)
		}
		if got := repo.Head(r); got != "main" {
			t.Fatalf("%s: new repository's HEAD names %q", c.name, got)
		}
		if out, err := s.env.Run(w, nil, append([]string{"push", s.pushURL("team/" + c.name)}, c.push...)...); err != nil {
			t.Fatalf("%s: push: %v\n%s", c.name, err, out)
		}
		if got := repo.Head(r); got != c.wantHead {
			t.Errorf("%s: HEAD names %q after pushing %v, want %q", c.name, got, c.push, c.wantHead)
		}
		clone := filepath.Join(t.TempDir(), "c")
		out, err := s.env.Run("", nil, "clone", s.httpURL("team/"+c.name), clone)
		if err != nil || strings.Contains(out, "remote HEAD refers to nonexistent ref") {
			t.Fatalf("%s: clone: %v\n%s", c.name, err, out)
		}
		if b, err := os.ReadFile(filepath.Join(clone, "README")); err != nil || string(b) != "hello\n" {
			t.Fatalf("%s: the clone checked out nothing: %v", c.name, err)
		}
		if out, err := s.env.Run(t.TempDir(), nil, "archive", "--remote="+s.gitURL("team/"+c.name), "-o", "a.tar", "HEAD"); err != nil {
			t.Fatalf("%s: archive --remote HEAD: %v\n%s", c.name, err, out)
		}
	}
	// Once HEAD's branch exists, later pushes leave it alone.
	r, _ := s.Data.Repos.Resolve("team/readme")
	if out, err := s.env.Run(w, nil, "push", s.pushURL("team/readme"), "trunk"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	if got := repo.Head(r); got != "main" {
		t.Fatalf("HEAD moved to %q after a later push", got)
	}
	// set-head: to an existing branch only.
	if err := repo.SetHead(ctx, r, "trunk"); err != nil || repo.Head(r) != "trunk" {
		t.Fatalf("set-head trunk: %v, HEAD %q", err, repo.Head(r))
	}
	if err := repo.SetHead(ctx, r, "nope"); err == nil || !strings.Contains(err.Error(), `no branch "nope" in team/readme`) {
		t.Fatalf("set-head to a missing branch: %v", err)
	}
	if err := repo.SetHead(ctx, r, "bad..name"); err == nil {
		t.Fatal("set-head to an invalid name worked")
	}
}
