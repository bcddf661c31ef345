//go:build unix

package gitexec

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStopGentlyLeavesNoRefLock: a git update-ref whose context ends with
// its ref transaction prepared (the ref locked) removes the lock when
// stopped gently. Killed, it left refs/heads/x.lock, and every later
// update of x failed with "File exists" (a catch-up cut at its deadline
// in bench/chaos's kill-replica run kept a copy behind for good).
func TestStopGentlyLeavesNoRefLock(t *testing.T) {
	dir := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir, "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	bare := filepath.Join(dir, "r.git")
	git("init", "-q", "--bare", bare)
	tree := git("--git-dir", bare, "hash-object", "-w", "-t", "tree", "/dev/null")
	commit := git("--git-dir", bare, "commit-tree", "-m", "x", tree)

	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "git", "--git-dir", bare, "update-ref", "--stdin")
	StopGently(cmd, 5*time.Second)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	in.Write([]byte("start\nupdate refs/heads/x " + commit + "\nprepare\n"))
	answers := bufio.NewReader(out)
	for _, want := range []string{"start: ok", "prepare: ok"} {
		line, err := answers.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != want {
			t.Fatalf("update-ref answered %q (%v), want %q", line, err, want)
		}
	}
	lock := filepath.Join(bare, "refs", "heads", "x.lock")
	if _, err := os.Stat(lock); err != nil {
		t.Fatalf("the prepared transaction holds no lock: %v", err)
	}
	cancel()
	cmd.Wait()
	if _, err := os.Stat(lock); err == nil {
		t.Fatalf("%s left behind by a stopped update-ref", lock)
	}
}
