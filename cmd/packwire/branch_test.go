package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDefaultBranchCommands: the server-wide default branch, repo create
// --default-branch, and repo set-head, through the binary.
func TestDefaultBranchCommands(t *testing.T) {
	data := newData(t)
	head := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(data, "repos", name+".git", "HEAD"))
		return strings.TrimSpace(string(b))
	}
	if out, code := packwire(t, "repo", "create", "a", "--data", data); code != 0 || head("a") != "ref: refs/heads/main" {
		t.Fatalf("repo create: %d %s, HEAD %q", code, out, head("a"))
	}
	if out, code := packwire(t, "default-branch", "--data", data); code != 0 || strings.TrimSpace(out) != "main" {
		t.Fatalf("default-branch: %d %q", code, out)
	}
	if out, code := packwire(t, "default-branch", "trunk", "--data", data); code != 0 {
		t.Fatalf("default-branch trunk: %d %s", code, out)
	}
	if out, code := packwire(t, "repo", "create", "b", "--data", data); code != 0 || head("b") != "ref: refs/heads/trunk" {
		t.Fatalf("repo create after default-branch trunk: %d %s, HEAD %q", code, out, head("b"))
	}
	if out, code := packwire(t, "repo", "create", "c", "--default-branch", "dev", "--data", data); code != 0 || head("c") != "ref: refs/heads/dev" {
		t.Fatalf("repo create --default-branch dev: %d %s, HEAD %q", code, out, head("c"))
	}
	if out, code := packwire(t, "default-branch", "bad..name", "--data", data); code == 0 || !strings.Contains(out, `invalid branch name "bad..name"`) {
		t.Fatalf("invalid default branch: %d %s", code, out)
	}
	// An empty repository's HEAD may name any valid branch.
	if out, code := packwire(t, "repo", "set-head", "a", "release", "--data", data); code != 0 || head("a") != "ref: refs/heads/release" {
		t.Fatalf("repo set-head: %d %s, HEAD %q", code, out, head("a"))
	}
	if out, code := packwire(t, "repo", "set-head", "nope", "x", "--data", data); code == 0 || !strings.Contains(out, "not found") {
		t.Fatalf("set-head of a missing repository: %d %s", code, out)
	}
}
