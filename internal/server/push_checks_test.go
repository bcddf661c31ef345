package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/repo"
)

// TestPushedObjectsChecked: git checks every pushed object
// (receive.fsckObjects) and its message reaches the client; a corrupt tree
// (an entry name with a slash, git fsck's fullPathname) is refused and the
// repository is left as it was, over HTTP and SSH.
func TestPushedObjectsChecked(t *testing.T) {
	t.Parallel()
	for _, transport := range pushTransports {
		t.Run(transport, func(t *testing.T) {
			s := startAccessServer(t)
			bare := s.seed(t, "team/app")
			s.grant(t, "alice", "write", "**")
			before := s.env.Git(bare, "show-ref")
			w := s.work(t, bare)
			blobID := hashObject(t, s, w, "blob", []byte("secret\n"))
			raw, _ := hex.DecodeString(blobID)
			tree := hashObject(t, s, w, "tree", append([]byte("100644 a/b\x00"), raw...))
			commit := strings.TrimSpace(s.env.Git(w, "commit-tree", tree, "-p", "HEAD", "-m", "corrupt"))
			out, err := s.git(t, w, transport, s.alice, "team/app", "push", "URL", commit+":refs/heads/main")
			if err == nil || !strings.Contains(out, "fullPathname") {
				t.Fatalf("corrupt push: %v\n%s", err, out)
			}
			if after := s.env.Git(bare, "show-ref"); after != before {
				t.Fatalf("refs changed:\n%s", after)
			}
			if _, err := s.env.Run(bare, nil, "cat-file", "-e", tree); err == nil {
				t.Fatal("the corrupt tree was stored")
			}
			s.env.Fsck(bare)
		})
	}
}

// hashObject writes an object of any content with hash-object --literally.
func hashObject(t *testing.T, s *accessServer, dir, typ string, content []byte) string {
	t.Helper()
	cmd := exec.Command("git", "hash-object", "--literally", "-w", "-t", typ, "--stdin")
	cmd.Dir = dir
	cmd.Env = s.env.Vars
	cmd.Stdin = strings.NewReader(string(content))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hash-object: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestPushSizeBounds: --max-push-bytes and a repository's quota bound what
// one push may bring, with git's message; a repository over its quota
// refuses what brings objects, and still takes deletes.
func TestPushSizeBounds(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MaxPushBytes = 256 << 10 })
	bare := s.seed(t, "team/app")
	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", s.httpURL("team/app"), w)
	addRandom := func(name string, size int) {
		b := make([]byte, size)
		rand.Read(b)
		os.WriteFile(filepath.Join(w, name), b, 0o644)
		s.env.Git(w, "add", name)
		s.env.Git(w, "commit", "-qm", name)
	}
	addRandom("big.bin", 1<<20)
	out, err := s.env.Run(w, nil, "push", s.pushURL("team/app"), "HEAD:refs/heads/big")
	if err == nil || !strings.Contains(out, "pack exceeds maximum allowed size") {
		t.Fatalf("push over --max-push-bytes: %v\n%s", err, out)
	}
	s.env.Git(w, "reset", "-q", "--hard", "HEAD~1")
	addRandom("small.bin", 10<<10)
	if out, err := s.env.Run(w, nil, "push", s.pushURL("team/app"), "HEAD:refs/heads/small"); err != nil {
		t.Fatalf("small push: %v\n%s", err, out)
	}

	r, err := s.Data.Repos.Resolve("team/app")
	if err != nil {
		t.Fatal(err)
	}
	used, err := repo.Usage(r)
	if err != nil || used == 0 {
		t.Fatalf("usage %d %v", used, err)
	}
	ctx := context.Background()
	// Room for 50 KiB more: a 100 KiB push exceeds it.
	if err := repo.SetQuota(ctx, r, used+50<<10); err != nil {
		t.Fatal(err)
	}
	addRandom("medium.bin", 100<<10)
	if out, err := s.env.Run(w, nil, "push", s.pushURL("team/app"), "HEAD:refs/heads/medium"); err == nil || !strings.Contains(out, "pack exceeds maximum allowed size") {
		t.Fatalf("push over the quota's room: %v\n%s", err, out)
	}
	// Over the quota: refused with the reason; a delete still goes through.
	if err := repo.SetQuota(ctx, r, used/2); err != nil {
		t.Fatal(err)
	}
	if out, err := s.env.Run(w, nil, "push", s.pushURL("team/app"), "HEAD:refs/heads/medium"); err == nil || !strings.Contains(out, "repository over its quota") {
		t.Fatalf("push into a repository over its quota: %v\n%s", err, out)
	}
	if out, err := s.env.Run(w, nil, "push", s.pushURL("team/app"), ":refs/heads/small"); err != nil {
		t.Fatalf("delete in a repository over its quota: %v\n%s", err, out)
	}
	if err := repo.SetQuota(ctx, r, 0); err != nil {
		t.Fatal(err)
	}
	if q, err := repo.Quota(r); err != nil || q != 0 {
		t.Fatalf("quota after removal: %d %v", q, err)
	}
	if out, err := s.env.Run(w, nil, "push", s.pushURL("team/app"), "HEAD:refs/heads/medium"); err != nil {
		t.Fatalf("push after the quota was removed: %v\n%s", err, out)
	}
	s.env.Fsck(bare)
}
