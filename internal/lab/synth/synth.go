// Package synth makes bare Git repositories with the shapes of the three
// repositories of GitHub's clone study (jquery, swift, linux), so the
// study can be replayed without downloading anything.
//
// A shape is more than object counts: the tree's depth and fan-out, file
// sizes (mostly small text files, a long tail, a few large ones), how many
// files a commit touches (mostly one to five), merged topic branches,
// release branches with backports, annotated tags. Files are code-like
// text whose versions differ by a few hunks, so packs compress and delta
// as they do for source code. At scale F the commit, tree and blob counts
// are F times the study's.
//
// The history is written by Go as one git fast-import stream. The
// generator keeps its own copy of every branch's tree with git's object
// ids, so it knows exactly how many trees and blobs git will store and
// steers each commit (how many files, how deep) towards the shape's
// counts as it goes. Everything comes from one seeded random source and
// fixed names and dates: the same shape, scale and seed give the same
// object ids.
package synth

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Options says what to generate. Seed 0 is a seed like any other.
type Options struct {
	Shape string  // one of Shapes()
	Scale float64 // 1 = the study's counts
	Out   string  // the bare repository to create; must not exist or be empty
	Seed  int64
	// PullRefs adds refs/pull/1/head .. refs/pull/N/head, as hosted
	// repositories carry them: side commits off commits spread over main's
	// history, each editing a few lines of one file, reachable from no
	// branch or tag (clones never fetch them). They change nothing else:
	// branches, tags and their objects are those made without them.
	PullRefs int
	Progress io.Writer // progress lines while generating, if not nil
}

// Result describes the repository made, as counted in it afterwards.
// The object counts are of every object stored, pull requests' included.
type Result struct {
	Commits, Trees, Blobs int
	Branches, Tags        int
	PullRefs              int    // refs under refs/pull/
	Head                  string // object id of main
	Bytes                 int64  // size of the repository on disk
	Elapsed               time.Duration
}

// MaxScale bounds Options.Scale: beyond it a generated linux would need
// tens of gigabytes.
const MaxScale = 4

// Generate makes the repository o describes. Out must not exist or be an
// empty directory; on failure what was written there is removed.
func Generate(ctx context.Context, o Options) (Result, error) {
	res, _, err := generate(ctx, o)
	return res, err
}

// stats are the generator's own counts, to compare with git's in tests.
type stats struct {
	commits, trees, blobs int
	mainTree              string
	// pull requests' objects, not in the counts above
	pullCommits, pullTrees, pullBlobs int
}

func generate(ctx context.Context, o Options) (Result, stats, error) {
	start := time.Now()
	sh, ok := shapes[o.Shape]
	if !ok {
		return Result{}, stats{}, fmt.Errorf("unknown shape %q: choose one of %s", o.Shape, strings.Join(Shapes(), ", "))
	}
	if math.IsNaN(o.Scale) || o.Scale <= 0 || o.Scale > MaxScale {
		return Result{}, stats{}, fmt.Errorf("scale %g is out of range: it must be above 0 and at most %d", o.Scale, MaxScale)
	}
	t, err := targetsFor(sh, o.Scale)
	if err != nil {
		return Result{}, stats{}, err
	}
	if o.PullRefs < 0 || o.PullRefs > MaxPullRefs {
		return Result{}, stats{}, fmt.Errorf("pull refs %d is out of range: it must be 0 to %d", o.PullRefs, MaxPullRefs)
	}
	if o.Out == "" {
		return Result{}, stats{}, errors.New("no output directory given")
	}
	if _, err := exec.LookPath("git"); err != nil {
		return Result{}, stats{}, errors.New("git is not installed (or not on the PATH)")
	}
	created, err := prepareOut(o.Out)
	if err != nil {
		return Result{}, stats{}, err
	}
	res, st, err := build(ctx, o, sh, t)
	if err != nil {
		cleanOut(o.Out, created)
		return Result{}, stats{}, err
	}
	res.Elapsed = time.Since(start)
	return res, st, nil
}

// prepareOut makes sure out is a new or empty directory and reports
// whether it created it.
func prepareOut(out string) (bool, error) {
	entries, err := os.ReadDir(out)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return true, os.MkdirAll(out, 0o755)
	case err != nil:
		return false, fmt.Errorf("output %s: %w", out, err)
	case len(entries) > 0:
		return false, fmt.Errorf("output %s exists and is not empty", out)
	}
	return false, nil
}

func cleanOut(out string, created bool) {
	if created {
		os.RemoveAll(out)
		return
	}
	entries, _ := os.ReadDir(out)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(out, e.Name()))
	}
}

func build(ctx context.Context, o Options, sh *shape, t targets) (Result, stats, error) {
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return Result{}, stats{}, err
	}
	env := gitEnv(out)
	if _, err := runGit(ctx, env, "init", "--bare", "-q"); err != nil {
		return Result{}, stats{}, err
	}
	cmd := exec.CommandContext(ctx, "git", "fast-import", "--quiet", "--done", "--active-branches=64")
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return Result{}, stats{}, err
	}
	if err := cmd.Start(); err != nil {
		return Result{}, stats{}, fmt.Errorf("git fast-import: %w", err)
	}
	g := newGenerator(sh, t, o.Seed, o.PullRefs, bufio.NewWriterSize(stdin, 1<<20), o.Progress)
	genErr := g.run(ctx)
	stdin.Close()
	waitErr := cmd.Wait()
	switch {
	case ctx.Err() != nil:
		return Result{}, stats{}, ctx.Err()
	case waitErr != nil:
		return Result{}, stats{}, fmt.Errorf("git fast-import: %v: %s", waitErr, strings.TrimSpace(stderr.String()))
	case genErr != nil:
		return Result{}, stats{}, fmt.Errorf("writing to git fast-import: %w", genErr)
	}
	st := stats{commits: g.commits, trees: g.trees, blobs: g.blobs, mainTree: fmt.Sprintf("%x", g.main.root.oid),
		pullCommits: g.pulls.commits, pullTrees: g.pulls.trees, pullBlobs: g.pulls.blobs}

	if _, err := runGit(ctx, env, "symbolic-ref", "HEAD", "refs/heads/main"); err != nil {
		return Result{}, st, err
	}
	if _, err := runGit(ctx, env, "pack-refs", "--all"); err != nil {
		return Result{}, st, err
	}
	res := Result{}
	objects, err := runGit(ctx, env, "cat-file", "--batch-all-objects", "--batch-check=%(objecttype)")
	if err != nil {
		return Result{}, st, err
	}
	for _, line := range strings.Split(objects, "\n") {
		switch line {
		case "commit":
			res.Commits++
		case "tree":
			res.Trees++
		case "blob":
			res.Blobs++
		}
	}
	refs, err := runGit(ctx, env, "for-each-ref", "--format=%(refname)")
	if err != nil {
		return Result{}, st, err
	}
	for _, ref := range strings.Fields(refs) {
		switch {
		case strings.HasPrefix(ref, "refs/heads/"):
			res.Branches++
		case strings.HasPrefix(ref, "refs/tags/"):
			res.Tags++
		case strings.HasPrefix(ref, "refs/pull/"):
			res.PullRefs++
		}
	}
	head, err := runGit(ctx, env, "rev-parse", "refs/heads/main")
	if err != nil {
		return Result{}, st, err
	}
	res.Head = strings.TrimSpace(head)
	err = filepath.WalkDir(out, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, ierr := d.Info(); ierr == nil {
				res.Bytes += info.Size()
			}
		}
		return err
	})
	return res, st, err
}

// gitEnv is the environment for git working on the repository at dir:
// the caller's, without variables that would point git elsewhere.
func gitEnv(dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
			"GIT_COMMON_DIR", "GIT_NAMESPACE", "GIT_QUARANTINE_PATH":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "GIT_DIR="+dir)
}

func runGit(ctx context.Context, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
