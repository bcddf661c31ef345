package synth

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"packwire/internal/servertest"
)

func generatePullsT(t *testing.T, out string, seed int64, pulls int) (Result, stats) {
	t.Helper()
	res, st, err := generate(context.Background(), Options{Shape: "jquery", Scale: 0.02, Out: out, Seed: seed, PullRefs: pulls})
	if err != nil {
		t.Fatalf("generate with %d pull refs: %v", pulls, err)
	}
	return res, st
}

// TestPullRefs checks refs/pull/K/head: how many, what they are (a few
// commits editing a few files, off a commit of main), that they leave the history untouched and
// unreachable from branches and tags, and that they are deterministic.
func TestPullRefs(t *testing.T) {
	env := isolate(t)
	const n = 40
	dir := t.TempDir()
	plain, _ := generatePullsT(t, filepath.Join(dir, "plain.git"), 7, 0)
	res, st := generatePullsT(t, filepath.Join(dir, "pulls.git"), 7, n)
	again, _ := generatePullsT(t, filepath.Join(dir, "again.git"), 7, n)
	other, _ := generatePullsT(t, filepath.Join(dir, "other.git"), 8, n)
	repo := filepath.Join(dir, "pulls.git")
	refs := func(name string, patterns ...string) string {
		return env.Git(filepath.Join(dir, name), append([]string{"for-each-ref", "--format=%(objectname) %(refname)"}, patterns...)...)
	}

	if res.PullRefs != n || plain.PullRefs != 0 {
		t.Fatalf("PullRefs %d (want %d), %d without them", res.PullRefs, n, plain.PullRefs)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(refs("pulls.git", "refs/pull/")), "\n") {
		names = append(names, strings.Fields(line)[1])
	}
	var want []string
	for k := 1; k <= n; k++ {
		want = append(want, fmt.Sprintf("refs/pull/%d/head", k))
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("pull refs %v, want refs/pull/1/head .. refs/pull/%d/head", names, n)
	}

	// Deterministic per seed; the history itself is untouched by them.
	if refs("pulls.git") != refs("again.git") || again.Head != res.Head {
		t.Fatal("the same seed gave different pull refs")
	}
	if refs("other.git", "refs/pull/") == refs("pulls.git", "refs/pull/") {
		t.Fatal("another seed gave the same pull refs")
	}
	if refs("pulls.git", "refs/heads/", "refs/tags/") != refs("plain.git", "refs/heads/", "refs/tags/") || res.Head != plain.Head {
		t.Fatal("adding pull refs changed the branches or tags")
	}
	if other.Head == res.Head {
		t.Fatal("another seed gave the same history")
	}

	// Nothing of them is reachable from a branch or tag: what a clone
	// fetches is exactly the repository without them.
	cloned := func(name string) string {
		return env.Git(filepath.Join(dir, name), "rev-list", "--objects", "--branches", "--tags")
	}
	if cloned("pulls.git") != cloned("plain.git") {
		t.Fatal("the objects reachable from branches and tags differ with pull refs")
	}
	reachable := map[string]bool{}
	for _, line := range strings.Split(cloned("pulls.git"), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			reachable[f[0]] = true
		}
	}

	// The model's counts are git's: every pull adds its commits, the blobs
	// they write and the trees on their files' paths.
	if res.Commits != st.commits+st.pullCommits || res.Trees != st.trees+st.pullTrees || res.Blobs != st.blobs+st.pullBlobs {
		t.Fatalf("git stores %d commits, %d trees, %d blobs; the generator counted %d+%d, %d+%d, %d+%d",
			res.Commits, res.Trees, res.Blobs, st.commits, st.pullCommits, st.trees, st.pullTrees, st.blobs, st.pullBlobs)
	}
	if st.pullCommits < n || st.pullBlobs < n || st.pullTrees < n || res.Commits != plain.Commits+st.pullCommits {
		t.Fatalf("pull objects: %d commits, %d blobs, %d trees; %d commits with pulls, %d without", st.pullCommits, st.pullBlobs, st.pullTrees, res.Commits, plain.Commits)
	}

	// Each is a short chain of commits off main that modifies a few files
	// by a few lines each, off commits spread over main's history.
	parents := map[string]bool{}
	var depths []int
	chains := 0
	for k := 1; k <= n; k++ {
		ref := fmt.Sprintf("refs/pull/%d/head", k)
		commit := env.RevParse(repo, ref)
		if reachable[commit] {
			t.Fatalf("%s is reachable from a branch or tag", ref)
		}
		// "commit parent" per line, newest first: the last parent is the base.
		own := strings.Split(strings.TrimSpace(env.Git(repo, "rev-list", "--parents", ref, "--not", "--branches", "--tags")), "\n")
		commits := len(own)
		var parent string
		for _, line := range own {
			f := strings.Fields(line)
			if len(f) != 2 {
				t.Fatalf("%s: commit line %q, want one parent", ref, line)
			}
			parent = f[1]
		}
		if commits < 1 || commits > maxPullCommits {
			t.Fatalf("%s has %d commits of its own, want 1 to %d", ref, commits, maxPullCommits)
		}
		if commits > 1 {
			chains++
		}
		if _, err := env.Run(repo, nil, "merge-base", "--is-ancestor", parent, "main"); err != nil {
			t.Fatalf("%s is not off a commit of main: %v", ref, err)
		}
		parents[parent] = true
		depth, _ := strconv.Atoi(strings.TrimSpace(env.Git(repo, "rev-list", "--count", parent)))
		depths = append(depths, depth)
		status := strings.Fields(env.Git(repo, "diff-tree", "--no-commit-id", "-r", "--name-status", parent, commit))
		numstat := strings.Fields(env.Git(repo, "diff-tree", "--no-commit-id", "-r", "--numstat", parent, commit))
		if len(status) < 2 || len(status) > 2*maxPullFiles || len(numstat) != 3*len(status)/2 {
			t.Fatalf("%s changes %v, want 1 to %d modified files", ref, status, maxPullFiles)
		}
		for i := 0; i < len(status); i += 2 {
			if status[i] != "M" {
				t.Fatalf("%s changes %v, want modified files only", ref, status)
			}
		}
		for i := 0; i < len(numstat); i += 3 {
			added, _ := strconv.Atoi(numstat[i])
			deleted, _ := strconv.Atoi(numstat[i+1])
			if added < 1 || added > 11*commits || deleted > 3*commits {
				t.Fatalf("%s: +%d -%d lines in %s over %d commits, want a few lines", ref, added, deleted, numstat[i+2], commits)
			}
		}
	}
	if chains == 0 || chains == n {
		t.Fatalf("%d of %d pull requests have more than one commit, want some but not all", chains, n)
	}
	if len(parents) < n/2 || !slices.IsSorted(depths) || depths[0] > depths[n-1]/4 {
		t.Fatalf("pull requests are off %d distinct commits at depths %v: not spread over main's history", len(parents), depths)
	}
	env.Fsck(repo)
}

// TestPullRefsServed clones a repository with pull refs from packwire:
// the clone has none of them, and each is still fetched by name.
func TestPullRefsServed(t *testing.T) {
	srv := servertest.Start(t, nil)
	t.Setenv("HOME", srv.Env.Home)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	env := srv.Env
	bare := filepath.Join(srv.Data.Repos.Dir, "pr.git")
	generatePullsT(t, bare, 1, 12)
	clone := filepath.Join(t.TempDir(), "clone")
	env.Git("", "clone", "-q", srv.HTTPURL("pr"), clone)
	if refs := env.Git(clone, "for-each-ref"); strings.Contains(refs, "refs/pull/") {
		t.Fatalf("a clone fetched pull refs:\n%s", refs)
	}
	pull7 := env.RevParse(bare, "refs/pull/7/head")
	if _, err := env.Run(clone, nil, "cat-file", "-e", pull7); err == nil {
		t.Fatal("a clone has the commit of refs/pull/7/head")
	}
	env.Git(clone, "fetch", "-q", "origin", "refs/pull/7/head")
	if got := env.RevParse(clone, "FETCH_HEAD"); got != pull7 {
		t.Fatalf("fetched %s for refs/pull/7/head, want %s", got, pull7)
	}
	env.Fsck(clone)
}

// TestPullRequestSizes checks the draws against the survey the model
// follows: commits median 1 and third quartile 3; files quartiles 1, 3, 10.
func TestPullRequestSizes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 20000
	commits, files := make([]int, n), make([]int, n)
	for i := range n {
		commits[i], files[i] = pullCommits(rng), pullFiles(rng)
	}
	slices.Sort(commits)
	slices.Sort(files)
	q := func(s []int, f float64) int { return s[int(f*float64(len(s)-1))] }
	if q(commits, 0.5) != 1 || q(commits, 0.75) != 3 || commits[n-1] > maxPullCommits {
		t.Errorf("commits per pull request: median %d, third quartile %d, max %d; want 1, 3, <= %d",
			q(commits, 0.5), q(commits, 0.75), commits[n-1], maxPullCommits)
	}
	if q(files, 0.25) != 1 || q(files, 0.5) != 3 || q(files, 0.75) < 9 || q(files, 0.75) > 11 || files[n-1] > maxPullFiles {
		t.Errorf("files per pull request: quartiles %d, %d, %d, max %d; want 1, 3, 10, <= %d",
			q(files, 0.25), q(files, 0.5), q(files, 0.75), files[n-1], maxPullFiles)
	}
}
