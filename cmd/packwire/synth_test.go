package main

import (
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/gittest"
)

func TestSynthCommand(t *testing.T) {
	env := gittest.New(t)
	data := newData(t)
	out := filepath.Join(data, "repos", "jq.git")
	got, code := packwire(t, "synth", "--shape", "jquery", "--scale", "0.02", "--out", out, "--quiet")
	if code != 0 || !strings.Contains(got, "jquery x0.02 (seed 1): 157 commits") {
		t.Fatalf("synth: %d %s", code, got)
	}
	// Written under DATA/repos, it is a repository packwire serves.
	if list, _ := packwire(t, "repo", "list", "--data", data); list != "jq\n" {
		t.Fatalf("repo list: %q", list)
	}
	env.Fsck(out)
	if got, code := packwire(t, "synth", "--shape", "jquery", "--scale", "0.02", "--out", out); code != 1 || !strings.Contains(got, "not empty") {
		t.Fatalf("synth over an existing repository: %d %s", code, got)
	}
	for _, args := range [][]string{
		{"synth", "--out", out},
		{"synth", "--shape", "jquery"},
		{"synth", "--shape", "jquery", "--out", out, "extra"},
	} {
		if got, code := packwire(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2: %s", args, code, got)
		}
	}
	if got, code := packwire(t, "synth", "--shape", "jquery", "--out", out, "--scale", "x"); code != 2 || !strings.Contains(got, `--scale x: not a number`) {
		t.Fatalf("bad scale: %d %s", code, got)
	}
	if got, code := packwire(t, "synth", "--shape", "hg", "--out", t.TempDir()); code != 1 || !strings.Contains(got, `unknown shape "hg"`) {
		t.Fatalf("unknown shape: %d %s", code, got)
	}
	pulls := filepath.Join(t.TempDir(), "pulls.git")
	if got, code := packwire(t, "synth", "--shape", "jquery", "--scale", "0.02", "--pull-refs", "5", "--out", pulls, "--quiet"); code != 0 || !strings.Contains(got, "6 tags, 5 pull refs") {
		t.Fatalf("synth --pull-refs 5: %d %s", code, got)
	}
	if refs := env.Git(pulls, "for-each-ref", "--format=%(refname)", "refs/pull/"); strings.Count(refs, "\n") != 5 {
		t.Fatalf("synth --pull-refs 5 made:\n%s", refs)
	}
	if got, code := packwire(t, "synth", "--shape", "jquery", "--pull-refs", "-2", "--out", t.TempDir()); code != 1 || !strings.Contains(got, "out of range") {
		t.Fatalf("negative --pull-refs: %d %s", code, got)
	}
	if got, code := packwire(t, "synth", "--help"); code != 0 || !strings.Contains(got, "-seed") || !strings.Contains(got, "-scale") || !strings.Contains(got, "-pull-refs") {
		t.Fatalf("synth --help: %d %s", code, got)
	}
}
