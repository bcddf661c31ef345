package repo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"packwire/internal/gitexec"
)

// DefaultBranch is the branch a new repository's HEAD names unless the
// server's setting or the command says otherwise: what git itself, GitHub
// and GitLab create today.
const DefaultBranch = "main"

// SettingDefaultBranch is the store setting that overrides DefaultBranch
// for the whole server.
const SettingDefaultBranch = "default-branch"

// ErrInvalidBranch is returned for a name git would not take as a branch.
var ErrInvalidBranch = errors.New("invalid branch name")

// CheckBranch returns ErrInvalidBranch unless name is a valid branch name
// (git check-ref-format --branch, without its @{-N} forms).
func CheckBranch(name string) error {
	if name == "" || strings.HasPrefix(name, "-") || strings.Contains(name, "@{") {
		return fmt.Errorf("%w %q", ErrInvalidBranch, name)
	}
	if err := exec.Command("git", "check-ref-format", "refs/heads/"+name).Run(); err != nil {
		return fmt.Errorf("%w %q", ErrInvalidBranch, name)
	}
	return nil
}

// Head returns the branch HEAD names ("main" for ref: refs/heads/main), or
// "" when HEAD is detached or unreadable.
func Head(r Repo) string {
	b, err := os.ReadFile(filepath.Join(r.Path, "HEAD"))
	if err != nil {
		return ""
	}
	target, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "ref: refs/heads/")
	if !ok {
		return ""
	}
	return target
}

// SetHead points HEAD at refs/heads/branch. Unless the repository has no
// branch at all yet, the branch must exist: a HEAD naming a missing branch
// makes every clone check out nothing.
func SetHead(ctx context.Context, r Repo, branch string) error {
	if err := CheckBranch(branch); err != nil {
		return err
	}
	branches, err := git(ctx, r, "for-each-ref", "--format=%(refname)", "refs/heads/")
	if err != nil {
		return err
	}
	if branches != "" && !containsLine(branches, "refs/heads/"+branch) {
		return fmt.Errorf("no branch %q in %s (it has: %s)", branch, r.Name,
			strings.ReplaceAll(strings.ReplaceAll(branches, "refs/heads/", ""), "\n", ", "))
	}
	return PointHead(ctx, r, branch)
}

// PointHead makes HEAD name branch, whether or not the branch exists yet
// (a cluster copy may not have caught up with the push that made it).
func PointHead(ctx context.Context, r Repo, branch string) error {
	if err := CheckBranch(branch); err != nil {
		return err
	}
	_, err := git(ctx, r, "symbolic-ref", "HEAD", "refs/heads/"+branch)
	return err
}

// FollowFirstPush is what happens after a push created the branches
// created (refs/heads/..., in the client's order): if HEAD names a branch
// that does not exist, HEAD moves to the default branch if it was pushed,
// else to the only branch pushed, else to the first. So the first push of
// "trunk" into a new repository whose HEAD says "main" gives clones a
// checked-out tree, as the big hosts do. It returns the branch HEAD now
// names when it moved it.
func FollowFirstPush(ctx context.Context, r Repo, created []string) (string, error) {
	if len(created) == 0 {
		return "", nil
	}
	head := Head(r)
	if head == "" {
		return "", nil // detached: not ours to change
	}
	if refExists(r, "refs/heads/"+head) {
		return "", nil // HEAD's branch exists: the usual case, read from files
	}
	pick := created[0]
	for _, ref := range created {
		if ref == "refs/heads/"+DefaultBranch {
			pick = ref
		}
	}
	// Only refs that exist now: a created branch may have been deleted
	// again by a concurrent push.
	if !refExists(r, pick) {
		return "", nil
	}
	if _, err := git(ctx, r, "symbolic-ref", "HEAD", pick); err != nil {
		return "", err
	}
	return strings.TrimPrefix(pick, "refs/heads/"), nil
}

func git(ctx context.Context, r Repo, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-c", "safe.directory=*", "--git-dir", r.Path}, args...)...)
	gitexec.StopGently(cmd, 5*time.Second) // no HEAD.lock left behind
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// refExists tells whether ref is stored, loose or packed, from the files
// alone (a push that creates a branch asks it: no spawn for the answer).
func refExists(r Repo, ref string) bool {
	if fi, err := os.Stat(filepath.Join(r.Path, filepath.FromSlash(ref))); err == nil && fi.Mode().IsRegular() {
		return true
	}
	b, err := os.ReadFile(filepath.Join(r.Path, "packed-refs"))
	return err == nil && bytes.Contains(b, []byte(" "+ref+"\n"))
}

func containsLine(s, line string) bool {
	for _, l := range strings.Split(s, "\n") {
		if l == line {
			return true
		}
	}
	return false
}
