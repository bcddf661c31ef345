package server

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestPushVisibleToTheVeryNextRequest: with every answer warm (stamps,
// tips, the fetch cache and kept advertisements), a commit pushed straight
// into the repository is in the very next clone and fetch over every
// transport and protocol version, with no wait in between: a kept
// repository stamp (repostate) must notice the push at once.
func TestPushVisibleToTheVeryNextRequest(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	for _, tc := range transportCases(s, sshEnv) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // a repository of its own; it looks at nothing else
			name := "next/" + tc.name
			bare := s.seed(t, name)
			work := filepath.Join(t.TempDir(), "work")
			s.env.Git("", "clone", "-q", bare, work)
			runner := filepath.Join(t.TempDir(), "runner")
			tc.run(t, s, "", "clone", "-q", "--bare", tc.url(name), runner)
			for round := 0; round < 3; round++ {
				settle(t, bare)
				// Warm: the same clone twice (the second one replayed).
				for i := 0; i < 2; i++ {
					dir := filepath.Join(t.TempDir(), "warm")
					tc.run(t, s, "", "clone", "-q", "--bare", tc.url(name), dir)
				}
				s.env.Git(work, "commit", "-q", "--allow-empty", "-m", "next "+tc.name)
				s.env.Git(work, "push", "-q", "origin", "HEAD:main")
				want := s.env.RevParse(work, "HEAD")
				tc.run(t, s, runner, "fetch", "-q", "origin", "+refs/heads/*:refs/heads/*")
				if got := s.env.RevParse(runner, "main"); got != want {
					t.Fatalf("round %d: the fetch right after the push got main %s, want %s", round, got, want)
				}
				dir := filepath.Join(t.TempDir(), "next")
				out := tc.run(t, s, "", "clone", "-q", "--bare", tc.url(name), dir)
				if got := s.env.RevParse(dir, "main"); got != want {
					t.Fatalf("round %d: the clone right after the push has main %s, want %s\n%s", round, got, want, lastLines(out, 20))
				}
				s.env.Fsck(dir)
				if !strings.Contains(s.env.Git(dir, "log", "-1", "--format=%s", "main"), "next") {
					t.Fatalf("round %d: the pushed commit is not main's", round)
				}
			}
		})
	}
}
