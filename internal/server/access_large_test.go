package server

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLargeMirrorPush: 3,000 branches in one mirror push, a rule refusing
// a tenth of them: the report spans many side-band packets and is
// rewritten whole; the allowed refs are written, the others reported.
func TestLargeMirrorPush(t *testing.T) {
	t.Parallel()
	for _, transport := range pushTransports {
		t.Run(transport, func(t *testing.T) {
			s := startAccessServer(t)
			s.seed(t, "team/app")
			bare := filepath.Join(s.Data.Dir, "repos", "team", "app.git")
			s.grant(t, "alice", "write", "**")
			s.rule(t, false, "create", "team/app", "refs/heads/b*7", "*")
			src := filepath.Join(t.TempDir(), "src.git")
			s.env.Git("", "clone", "-q", "--mirror", bare, src)
			var stdin strings.Builder
			for i := 0; i < 3000; i++ {
				fmt.Fprintf(&stdin, "create refs/heads/b%d refs/heads/main\n", i)
			}
			runStdin(t, src, stdin.String(), "update-ref", "--stdin")
			out, err := s.git(t, src, transport, s.alice, "team/app", "push", "--porcelain", "--mirror", "URL")
			if err == nil {
				t.Fatal("push with refused refs reported success")
			}
			if n := strings.Count(out, "[remote rejected] (protected: create denied)"); n != 300 {
				t.Fatalf("want 300 refused refs, got %d:\n%s", n, lastLines(out, 20))
			}
			refs := s.env.Git(bare, "for-each-ref", "--format=%(refname)", "refs/heads/")
			if n := strings.Count(refs, "\n"); n != 3000-300+3 { // + main, branch0, branch1
				t.Fatalf("server has %d branches", n)
			}
			if strings.Contains(refs, "refs/heads/b7\n") || !strings.Contains(refs, "refs/heads/b8\n") {
				t.Fatal("wrong refs written")
			}
			s.env.Fsck(bare)
		})
	}
}

func runStdin(t *testing.T, dir, stdin string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}
