package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/maintain"
)

// TestUnreachableObjectsNotServed: once the branch that held a secret is
// deleted, neither its commit nor its blob can be fetched by id, over any
// transport or protocol version, with or without a bitmap; objects that
// visible refs reach (an old commit, a blob deep in history) still can,
// and a blobless partial clone still checks out (its lazy fetch asks for
// blobs by id).
func TestUnreachableObjectsNotServed(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	bare := s.seed(t, "team/app")
	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", bare, w)
	oldCommit := s.env.RevParse(w, "HEAD~20")
	oldBlob := firstBlob(t, s, w, "HEAD~20")
	os.WriteFile(filepath.Join(w, "secret.txt"), []byte("the password is hunter2\n"), 0o644)
	s.env.Git(w, "add", "secret.txt")
	s.env.Git(w, "commit", "-qm", "oops")
	secretCommit := s.env.RevParse(w, "HEAD")
	secretBlob := s.env.RevParse(w, "HEAD:secret.txt")
	if out, err := s.env.Run(w, nil, "push", s.pushURL("team/app"), "HEAD:refs/heads/leak"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	if out, err := s.env.Run(w, nil, "push", s.pushURL("team/app"), ":refs/heads/leak"); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	s.env.Git(bare, "cat-file", "-e", secretBlob) // still stored: only reachability protects it

	check := func(t *testing.T, layout string) {
		for _, url := range []string{s.gitURL("team/app"), s.httpURL("team/app"), s.sshURL("team/app")} {
			for _, v := range []string{"0", "2"} {
				c := filepath.Join(t.TempDir(), "c")
				s.env.Git("", "init", "-q", c)
				fetch := func(id string) (string, error) {
					return s.env.Run(c, sshEnv, "-c", "protocol.version="+v, "fetch", "-q", "--no-tags", url, id)
				}
				for _, id := range []string{secretCommit, secretBlob} {
					out, err := fetch(id)
					if err == nil || !strings.Contains(out, "not our ref "+id) && !strings.Contains(out, "not our ref") {
						t.Errorf("%s %s v%s: fetching unreachable %s: err=%v\n%s", layout, url, v, id, err, out)
					}
					if _, err := s.env.Run(c, nil, "cat-file", "-e", id); err == nil {
						t.Errorf("%s %s v%s: %s arrived", layout, url, v, id)
					}
				}
				for _, id := range []string{oldCommit, oldBlob} {
					if out, err := fetch(id); err != nil {
						t.Errorf("%s %s v%s: fetching reachable %s: %v\n%s", layout, url, v, id, err, out)
					}
				}
			}
		}
		// A blobless clone checks out (lazy fetch of blobs by id) over HTTP v2.
		c := filepath.Join(t.TempDir(), "partial")
		if out, err := s.env.Run("", nil, "clone", "-q", "--filter=blob:none", s.httpURL("team/app"), c); err != nil {
			t.Fatalf("%s: blobless clone: %v\n%s", layout, err, out)
		}
		if out, err := s.env.Run(c, nil, "log", "-p", "-3", "--format=%H"); err != nil || !strings.Contains(out, "diff --git") {
			t.Fatalf("%s: lazy fetch of history: %v\n%s", layout, err, out)
		}
	}
	t.Run("no bitmap", func(t *testing.T) { check(t, "no bitmap") })
	r, err := s.Data.Repos.Resolve("team/app")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Maintainer.Run(context.Background(), r, maintain.Full, "test"); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(bare, "objects", "pack", "*.bitmap")); len(m) == 0 {
		t.Fatal("maintenance wrote no bitmap")
	}
	t.Run("bitmap", func(t *testing.T) { check(t, "bitmap") })
}

// firstBlob is the id of a file of rev's tree, at any depth.
func firstBlob(t *testing.T, s *testServer, w, rev string) string {
	t.Helper()
	for _, line := range strings.Split(s.env.Git(w, "ls-tree", "-r", rev), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[1] == "blob" {
			return f[2]
		}
	}
	t.Fatalf("no file in %s", rev)
	return ""
}
