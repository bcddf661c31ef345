// Package reach decides whether the objects a fetch wants may be served,
// and which of the objects it says it has may be acknowledged: only
// objects reachable from the refs a client can see. git's own
// upload-pack serves any object by id in protocol v2 (and in v0 a blob
// with uploadpack.allowReachableSHA1InWant), so a deleted branch that held
// a secret would stay fetchable by its id until gc removed its objects.
//
// Wants that are ref tips (what clones and most fetches ask for) are
// decided from the repository's ref files, without git (kept while the
// refs keep their repostate stamp). The others (the
// blobs a partial clone fetches lazily, a commit fetched by id) are asked
// of git in one rev-list: exact and cheap with a reachability bitmap,
// which maintenance keeps on every repository, and a full walk of the
// repository's objects without one.
package reach

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/oid"
	"packwire/internal/repostate"
)

// Hidden is the ref namespace that is neither shown to clients nor a
// source of reachability (gitexec.ServedConfig hides it).
const Hidden = "refs/packwire/"

// Checker answers for one repository.
type Checker struct {
	GitPath string // default "git"
	// Bundle is the file name, in each repository, of the clone bundle
	// served to every reader of it (maintain.BundleFile), "" when none
	// is served: haves of its tips and of its pack's objects are then
	// passed without git (bundle.go).
	Bundle string

	mu          sync.Mutex
	tips        map[string]keptTips       // by repository path
	bundles     map[string]*bundleObjects // by repository path
	bundleBytes int64                     // of the kept bundles' indexes
	gitRuns     atomic.Int64
}

// GitRuns is how many git processes the checker has started.
func (c *Checker) GitRuns() int64 { return c.gitRuns.Load() }

// keptTips are a repository's tips, read after its refs had the stamp digest.
type keptTips struct {
	digest string
	tips   map[string]bool
}

// keptTipsLimit bounds the repositories whose tips are kept.
const keptTipsLimit = 1024

// visibleTips returns Tips(repoPath), kept while the repository's refs
// keep their stamp (repostate.Refs: a kept stamp costs no walk). The tips
// are read after the stamp, so they are never older than it.
func (c *Checker) visibleTips(repoPath string) (map[string]bool, error) {
	st, err := repostate.Refs(repoPath, time.Now())
	if err != nil || st.Racy {
		return Tips(repoPath)
	}
	c.mu.Lock()
	k, ok := c.tips[repoPath]
	c.mu.Unlock()
	if ok && k.digest == st.Digest {
		return k.tips, nil
	}
	tips, err := Tips(repoPath)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.tips == nil || len(c.tips) >= keptTipsLimit {
		c.tips = map[string]keptTips{}
	}
	c.tips[repoPath] = keptTips{digest: st.Digest, tips: tips}
	c.mu.Unlock()
	return tips, nil
}

// Usage is the CPU the git processes of a check took, for the request's
// record.
type Usage struct{ User, Sys time.Duration }

func (u *Usage) add(st *os.ProcessState) {
	if st != nil {
		u.User += st.UserTime()
		u.Sys += st.SystemTime()
	}
}

// Unreachable returns the wants that no visible ref reaches, in their
// order (nil when all may be served), and what asking git cost.
func (c *Checker) Unreachable(ctx context.Context, repoPath string, wants []string) ([]string, Usage, error) {
	var u Usage
	if len(wants) == 0 {
		return nil, u, nil
	}
	tips, err := c.visibleTips(repoPath)
	if err != nil {
		return nil, u, err
	}
	var others []string
	for _, w := range wants {
		if !tips[w] {
			others = append(others, w)
		}
	}
	if len(others) == 0 {
		return nil, u, nil
	}
	unreachable, err := c.revList(ctx, repoPath, others, &u)
	if err != nil {
		return nil, u, err
	}
	var out []string
	for _, w := range others {
		if unreachable[w] {
			out = append(out, w)
		}
	}
	return out, u, nil
}

// UnreachableHaves returns the ids of "have" lines that no visible ref
// may be shown to reach, for dropping before git sees them: upload-pack
// ACKs any object it has, which would confirm that an unreachable object
// (a deleted branch's commit, a secret's blob) exists. Haves that are ref
// tips are decided from the ref files, haves the served clone bundle holds
// from its file and its pack's .idx (Bundle); the others in one rev-list. A have
// is only a hint (git sends more of the pack without it), so an error the
// other way is harmless: without a bitmap, a tree or blob deep in history
// counts as unreachable. Ids the repository lacks are left in: git ACKs
// none of them.
func (c *Checker) UnreachableHaves(ctx context.Context, repoPath string, haves []string) ([]string, Usage, error) {
	var u Usage
	if len(haves) == 0 {
		return nil, u, nil
	}
	tips, err := c.visibleTips(repoPath)
	if err != nil {
		return nil, u, err
	}
	var others []string
	for _, h := range haves {
		if !tips[h] {
			others = append(others, h)
		}
	}
	if len(others) > 0 {
		if bundle := c.servedBundle(repoPath); bundle != nil {
			others = slices.DeleteFunc(others, bundle.has)
		}
	}
	if len(others) == 0 {
		return nil, u, nil
	}
	git := c.GitPath
	if git == "" {
		git = "git"
	}
	// Printed: reached from a have, not from a visible ref. With
	// --ignore-missing, ids git does not have are passed over.
	args := []string{"-c", "safe.directory=*", "rev-list", "--objects", "--no-object-names", "--ignore-missing"}
	if hasBitmap(repoPath) {
		args = append(args, "--use-bitmap-index")
	}
	args = append(args, "--not", "--exclude="+Hidden+"*", "--all", "--stdin")
	cmd := exec.CommandContext(ctx, git, args...)
	cmd.Dir = repoPath
	cmd.Env = append(gitexec.Environ(), "GIT_DIR="+repoPath)
	cmd.Stdin = strings.NewReader(strings.Join(others, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, u, err
	}
	c.gitRuns.Add(1)
	if err := cmd.Start(); err != nil {
		return nil, u, err
	}
	asked := make(map[string]bool, len(others))
	for _, id := range others {
		asked[id] = true
	}
	printed := map[string]bool{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if id := sc.Text(); asked[id] {
			printed[id] = true
		}
	}
	err = cmd.Wait()
	u.add(cmd.ProcessState)
	if err != nil {
		return nil, u, fmt.Errorf("rev-list: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	var drop []string
	for _, id := range others {
		if printed[id] {
			drop = append(drop, id)
		}
	}
	return drop, u, nil
}

// revList asks git which of ids visible refs do not reach. With a bitmap
// (a pack's, or the multi-pack-index's) "rev-list --objects
// --use-bitmap-index IDS --not --all" prints exactly those objects (and
// what only they reach). Without one, rev-list's object walk only marks
// what the boundary commits' trees hold, so trees and blobs deeper in
// history would look unreachable: then the whole object graph is walked
// instead.
func (c *Checker) revList(ctx context.Context, repoPath string, ids []string, u *Usage) (map[string]bool, error) {
	git := c.GitPath
	if git == "" {
		git = "git"
	}
	exclude := "--exclude=" + Hidden + "*"
	var args []string
	var stdin bytes.Buffer
	bitmap := hasBitmap(repoPath)
	if bitmap {
		args = []string{"rev-list", "--objects", "--use-bitmap-index", "--no-object-names", "--not", exclude, "--all", "--stdin"}
		for _, id := range ids {
			stdin.WriteString(id + "\n")
		}
	} else {
		args = []string{"rev-list", "--objects", "--no-object-names", exclude, "--all"}
	}
	cmd := exec.CommandContext(ctx, git, append([]string{"-c", "safe.directory=*"}, args...)...)
	cmd.Dir = repoPath
	cmd.Env = append(gitexec.Environ(), "GIT_DIR="+repoPath)
	cmd.Stdin = &stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.gitRuns.Add(1)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	printed := map[string]bool{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		id := sc.Text()
		if want[id] {
			printed[id] = true
		}
	}
	err = cmd.Wait()
	u.add(cmd.ProcessState)
	if err != nil {
		// An id git does not have at all is not reachable either.
		if msg := stderr.String(); strings.Contains(msg, "bad object") || strings.Contains(msg, "bad revision") {
			return c.missingOrUnreachable(ctx, git, repoPath, ids, u)
		}
		return nil, fmt.Errorf("rev-list: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	if bitmap {
		return printed, nil // printed: unreachable
	}
	unreachable := map[string]bool{}
	for _, id := range ids {
		if !printed[id] { // printed: reachable
			unreachable[id] = true
		}
	}
	return unreachable, nil
}

// missingOrUnreachable splits off the ids the repository lacks (which git
// will refuse as well) and asks again about the rest.
func (c *Checker) missingOrUnreachable(ctx context.Context, git, repoPath string, ids []string, u *Usage) (map[string]bool, error) {
	cmd := exec.CommandContext(ctx, git, "-c", "safe.directory=*", "cat-file", "--batch-check=%(objectname) %(objecttype)")
	cmd.Dir = repoPath
	cmd.Env = append(gitexec.Environ(), "GIT_DIR="+repoPath)
	cmd.Stdin = strings.NewReader(strings.Join(ids, "\n") + "\n")
	c.gitRuns.Add(1)
	out, err := cmd.Output()
	u.add(cmd.ProcessState)
	if err != nil {
		return nil, fmt.Errorf("cat-file: %w", err)
	}
	unreachable := map[string]bool{}
	var present []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) != 2:
		case f[1] == "missing":
			unreachable[f[0]] = true
		default:
			present = append(present, f[0])
		}
	}
	if len(present) == 0 || len(present) == len(ids) {
		if len(present) == len(ids) {
			return nil, errors.New("rev-list refused objects the repository has")
		}
		return unreachable, nil
	}
	rest, err := c.revList(ctx, repoPath, present, u)
	if err != nil {
		return nil, err
	}
	for id := range rest {
		unreachable[id] = true
	}
	return unreachable, nil
}

// hasBitmap tells whether the repository has a reachability bitmap.
func hasBitmap(repoPath string) bool {
	entries, err := os.ReadDir(filepath.Join(repoPath, "objects", "pack"))
	if err != nil {
		return false
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".bitmap") {
			return true
		}
	}
	return false
}

// Tips returns the object ids of the repository's visible refs, from its
// files: packed-refs (with the peeled ids of annotated tags) and loose
// refs, and HEAD. A loose annotated tag's peeled commit is not known here;
// a want of it is asked of git.
func Tips(repoPath string) (map[string]bool, error) {
	tips := map[string]bool{}
	b, err := os.ReadFile(filepath.Join(repoPath, "packed-refs"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	visible := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "#") || line == "":
		case strings.HasPrefix(line, "^"):
			if id := line[1:]; visible && oid.Valid(id) {
				tips[id] = true
			}
		default:
			id, name, _ := strings.Cut(line, " ")
			visible = oid.Valid(id) && !strings.HasPrefix(name, Hidden)
			if visible {
				tips[id] = true
			}
		}
	}
	readLoose := func(path string) {
		b, err := os.ReadFile(path)
		if id := strings.TrimSpace(string(b)); err == nil && oid.Valid(id) {
			tips[id] = true
		}
	}
	readLoose(filepath.Join(repoPath, "HEAD")) // detached; a symref names a ref read below
	refs := filepath.Join(repoPath, "refs")
	err = filepath.WalkDir(refs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			if rel, _ := filepath.Rel(repoPath, p); filepath.ToSlash(rel)+"/" == Hidden {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() && !strings.HasSuffix(d.Name(), ".lock") {
			readLoose(p)
		}
		return nil
	})
	return tips, err
}

// Haves returns the object ids of the "have <id>" lines in pkt-line
// payloads.
func Haves(lines []string) []string {
	var ids []string
	for _, l := range lines {
		if id, ok := HaveID(l); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// HaveID returns the id of a "have <id>" payload.
func HaveID(line string) (string, bool) {
	id, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "have ")
	return id, ok && oid.Valid(id)
}

// Wants returns the object ids of the "want" lines in pkt-line payloads
// (v0's "want <id> <capabilities>", v2's "want <id>").
func Wants(lines []string) []string {
	var ids []string
	for _, l := range lines {
		rest, ok := strings.CutPrefix(strings.TrimSuffix(l, "\n"), "want ")
		if !ok {
			continue
		}
		id, _, _ := strings.Cut(rest, " ")
		if oid.Valid(id) {
			ids = append(ids, id)
		}
	}
	return ids
}
