package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/gittest"
)

// TestAccessOnDiskSpelling: with the repositories on a case-insensitive
// file system, a request for TEAM/SECRET reaches team/secret.git, and
// access is decided on the spelling on disk: a grant on team/secret lets
// its user read it under any spelling, a user without one gets "not found"
// as for a missing repository, a ref rule protecting team/secret's main
// refuses a push to TEAM/SECRET's (before, the spelling got around it), and
// records name team/secret.
func TestAccessOnDiskSpelling(t *testing.T) {
	t.Parallel() // its own server on its own exFAT mount
	data := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(gittest.CaseInsensitiveDir(t), filepath.Join(data, "repos")); err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, func(c *Config) { c.DataDir, c.SSHAddr = data, "127.0.0.1:0" })
	ctx := context.Background()
	if err := srv.Data.Store.RemoveGrant(ctx, "alice", "**"); err != nil {
		t.Fatal(err)
	}
	s := &accessServer{testServer: srv}
	s.alice = &actor{name: "alice", token: srv.token, key: s.addKey(t, "alice")}
	bare := s.seed(t, "team/secret")
	bob := s.addUser(t, "bob")
	if err := s.Data.Store.SetSetting(ctx, "anonymous-read", "off"); err != nil {
		t.Fatal(err)
	}
	s.grant(t, "bob", "read", "team/secret")
	s.grant(t, "alice", "write", "**") // so that only the rule stands between her and main
	s.rule(t, false, "push", "team/secret", "refs/heads/main", "*")

	dir := t.TempDir()
	for _, transport := range []string{"http", "ssh"} {
		for i, spelling := range []string{"team/secret", "TEAM/SECRET", "Team/Secret.git"} {
			name := transport + "/" + spelling
			out, err := s.git(t, dir, transport, bob, spelling, "ls-remote", "URL")
			if err != nil || !strings.Contains(out, "refs/heads/main") {
				t.Errorf("%s: bob's grant on team/secret does not apply: %v\n%s", name, err, out)
			}
			carol := s.addUser(t, fmt.Sprintf("carol-%s-%d", transport, i))
			if out, err := s.git(t, dir, transport, carol, spelling, "ls-remote", "URL"); err == nil || !strings.Contains(out, "not found") {
				t.Errorf("%s: read without a grant: %v\n%s", name, err, out)
			}
		}
		w := s.work(t, bare)
		s.commit(w, "change "+transport)
		out, err := s.git(t, w, transport, s.alice, "TEAM/SECRET", "push", "URL", "HEAD:refs/heads/main")
		if err == nil || !strings.Contains(out, "protected: push denied") {
			t.Errorf("%s: the rule on team/secret did not refuse a push to TEAM/SECRET: %v\n%s", transport, err, out)
		}
		if out, err := s.git(t, w, transport, s.alice, "TEAM/SECRET", "push", "URL", "HEAD:refs/heads/topic-"+transport); err != nil {
			t.Errorf("%s: alice may push other branches of TEAM/SECRET: %v\n%s", transport, err, out)
		}
	}
	logs := s.logs.String()
	if !strings.Contains(logs, "repo=team/secret") || strings.Contains(logs, "repo=TEAM") || strings.Contains(logs, "repo=Team") {
		t.Errorf("records, refusals included, must name team/secret:\n%s", lastLines(logs, 20))
	}
}
