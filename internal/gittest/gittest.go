// Package gittest drives the real git client for end-to-end tests: an
// isolated HOME, GIT_CONFIG_NOSYSTEM=1, no prompts, fixed identities, and
// quick ways to build repositories of a chosen shape with fast-import.
package gittest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/needs"
)

// Env is an isolated git client environment.
type Env struct {
	T    testing.TB
	Home string
	Vars []string // the environment every git command gets
}

// New returns a client environment with its own HOME. A missing git fails
// the test: a skipped end-to-end test would pass without proving anything.
func New(t testing.TB) *Env {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		needs.Missing(t, "git is not installed: run scripts/install-deps (apt-get install -y git openssh-client)")
	}
	home := t.TempDir()
	vars := []string{
		"HOME=" + home,
		"PATH=" + os.Getenv("PATH"),
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com",
		"GIT_AUTHOR_DATE=2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2026-01-01T00:00:00Z",
		"LANG=C", "LC_ALL=C",
	}
	e := &Env{T: t, Home: home, Vars: vars}
	e.Git("", "config", "--global", "init.defaultBranch", "main")
	e.Git("", "config", "--global", "gc.auto", "0")
	e.Git("", "config", "--global", "advice.detachedHead", "false")
	return e
}

// Run runs git in dir with extra environment and returns combined output.
func (e *Env) Run(dir string, extraEnv []string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(append([]string{}, e.Vars...), extraEnv...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.String(), err
}

// Git runs git and fails the test on error.
func (e *Env) Git(dir string, args ...string) string {
	e.T.Helper()
	out, err := e.Run(dir, nil, args...)
	if err != nil {
		e.T.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// RevParse returns the object id a revision names in repo dir.
func (e *Env) RevParse(dir, rev string) string {
	e.T.Helper()
	return strings.TrimSpace(e.Git(dir, "rev-parse", rev))
}

// Fsck runs a full git fsck and fails the test on any problem.
func (e *Env) Fsck(dir string) {
	e.T.Helper()
	e.Git(dir, "fsck", "--full", "--strict", "--no-dangling")
}

// Shape describes a synthetic history.
type Shape struct {
	Ref         string // branch the history goes to (default refs/heads/main)
	Commits     int    // commits on main
	Files       int    // files in the tree, spread over a few directories
	BlobBytes   int    // size of each file version
	Random      bool
	Branches    int // extra branches, each one commit off main
	Tags        int // annotated tags on main's history
	Seed        uint64
	Incompress  bool // random bytes instead of text (makes large packs)
	ChangePerCo int  // files changed per commit (default 3)
}

// Build fills the bare repository at bare (created if missing) with a
// history of the given shape via git fast-import, deterministic for a seed.
func (e *Env) Build(bare string, s Shape) {
	e.T.Helper()
	if _, err := os.Stat(filepath.Join(bare, "HEAD")); err != nil {
		e.Git("", "init", "--bare", "-q", bare)
	}
	if s.Files == 0 {
		s.Files = 10
	}
	if s.BlobBytes == 0 {
		s.BlobBytes = 200
	}
	if s.Ref == "" {
		s.Ref = "refs/heads/main"
	}
	if s.ChangePerCo == 0 {
		s.ChangePerCo = 3
	}
	rng := rand.New(rand.NewPCG(s.Seed, 42))
	var in bytes.Buffer
	content := func() []byte {
		b := make([]byte, s.BlobBytes)
		if s.Incompress {
			for i := range b {
				b[i] = byte(rng.UintN(256))
			}
			return b
		}
		words := []string{"git ", "pack ", "wire ", "clone ", "fetch ", "delta ", "tree ", "blob\n"}
		for i := 0; i < len(b); {
			w := words[rng.IntN(len(words))]
			i += copy(b[i:], w)
		}
		return b
	}
	path := func(i int) string { return fmt.Sprintf("dir%d/sub%d/file%d.txt", i%7, i%3, i) }
	mark := 0
	when := 1767225600 // 2026-01-01
	for c := 0; c < s.Commits; c++ {
		mark++
		fmt.Fprintf(&in, "commit %s\nmark :%d\ncommitter Test <test@example.com> %d +0000\n", s.Ref, mark, when+c*60)
		msg := fmt.Sprintf("commit %d", c)
		fmt.Fprintf(&in, "data %d\n%s\n", len(msg), msg)
		if c > 0 {
			fmt.Fprintf(&in, "from :%d\n", mark-1)
		}
		var files []int
		if c == 0 {
			for i := 0; i < s.Files; i++ {
				files = append(files, i)
			}
		} else {
			for i := 0; i < s.ChangePerCo; i++ {
				files = append(files, rng.IntN(s.Files))
			}
		}
		for _, f := range files {
			b := content()
			fmt.Fprintf(&in, "M 100644 inline %s\ndata %d\n", path(f), len(b))
			in.Write(b)
			in.WriteByte('\n')
		}
	}
	head := mark
	for b := 0; b < s.Branches; b++ {
		mark++
		fmt.Fprintf(&in, "commit refs/heads/branch%d\nmark :%d\ncommitter Test <test@example.com> %d +0000\ndata 6\nbranch\nfrom :%d\n", b, mark, when, head)
		fmt.Fprintf(&in, "M 100644 inline branch%d.txt\ndata 2\nb\n", b)
	}
	for t := 0; t < s.Tags && t < s.Commits; t++ {
		fmt.Fprintf(&in, "tag v%d\nfrom :%d\ntagger Test <test@example.com> %d +0000\ndata 4\ntag\n", t, t+1, when)
	}
	// Large random blobs neither compress nor delta: searching for either
	// only burns CPU (a 40 MiB shape: 11 s for repack's delta search, 2 s
	// without) for the same pack of stored zlib blocks. (Small ones keep
	// the search: their many trees delta well.) fast-import tries a delta
	// of each blob against the one before it unless the blob is over
	// core.bigFileThreshold (4.9 s of CPU for the 43 MiB shape, 3.1 s
	// without).
	importArgs, repackArgs := []string{"fast-import", "--quiet"}, []string{"repack", "-adq"}
	if s.Incompress && s.BlobBytes >= 64<<10 {
		importArgs = append([]string{"-c", "pack.compression=0", "-c", "core.bigFileThreshold=32k"}, importArgs...)
		repackArgs = append(repackArgs, "--window=0")
	}
	cmd := exec.Command("git", importArgs...)
	cmd.Dir = bare
	cmd.Env = e.Vars
	cmd.Stdin = &in
	if out, err := cmd.CombinedOutput(); err != nil {
		e.T.Fatalf("fast-import: %v\n%s", err, out)
	}
	if s.Ref == "refs/heads/main" {
		e.Git(bare, "symbolic-ref", "HEAD", "refs/heads/main")
	}
	e.Git(bare, repackArgs...)
}
