package main

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/pgtest"
	"packwire/internal/s3test"
	"packwire/internal/server"
)

// TestClusterLFS: two cluster nodes sharing a bucket of a real S3 server
// (weed) and the LFS index in PostgreSQL: an object git-lfs pushes through
// one node is cloned through the other; a node without --lfs-store refuses
// LFS, naming the flag.
func TestClusterLFS(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git-lfs"); err != nil {
		t.Fatal("git-lfs is not installed: run scripts/install-deps (apt-get install -y git-lfs)")
	}
	weed := s3test.Shared(t)
	bucket := weed.NewBucket(t)
	store := weed.StoreURL(t, bucket)
	url := pgtest.Shared(t).NewDatabase(t)
	nodes := startNodes(t, url, []string{"a", "b"}, 200*time.Millisecond, time.Second, func(c *server.Config) {
		c.LFSStore = store
	})
	admin := storeAdmin(t, url, filepath.Join(t.TempDir(), "none"))
	// Placed on a and b: a node serves LFS for the repositories it holds.
	admin("repo", "create", "team/lfs", "--replicas", "2")
	plain := startNodes(t, url, []string{"c"}, 200*time.Millisecond, time.Second, nil)["c"]
	token := aliceWrites(admin)
	remote := func(node string) string {
		return fmt.Sprintf("http://alice:%s@%s/team/lfs", token, nodes[node].HTTPAddr)
	}
	env := nodes["a"].Env
	env.Git("", "lfs", "install", "--skip-repo")
	waitUntil(t, time.Minute, "team/lfs on both nodes", func() bool {
		_, errA := env.Run("", nil, "ls-remote", remote("a"))
		_, errB := env.Run("", nil, "ls-remote", remote("b"))
		return errA == nil && errB == nil
	})

	r := rand.New(rand.NewPCG(31, 31))
	content := make([]byte, 150<<10)
	for i := range content {
		content[i] = byte(r.Uint32())
	}
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "init", "-q", "-b", "main", w)
	env.Git(w, "lfs", "track", "*.bin")
	os.WriteFile(filepath.Join(w, "a.bin"), content, 0o644)
	env.Git(w, "add", ".")
	env.Git(w, "commit", "-qm", "lfs")
	if out, err := env.Run(w, nil, "push", remote("a"), "main"); err != nil {
		t.Fatalf("push through a: %v\n%s", err, out)
	}
	if objects, _ := weed.Keys(t, bucket); len(objects) != 1 {
		t.Fatalf("bucket holds %v, want the one object", objects)
	}
	c := filepath.Join(t.TempDir(), "c")
	if out, err := env.Run("", nil, "clone", "-q", remote("b"), c); err != nil {
		t.Fatalf("clone through b: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(c, "a.bin")); !bytes.Equal(got, content) {
		t.Fatalf("a.bin cloned through b is %d bytes, not the content pushed through a", len(got))
	}

	// The node without the shared store refuses LFS and says why.
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://%s/team/lfs.git/info/lfs/objects/batch", plain.HTTPAddr),
		strings.NewReader(`{"operation":"download","objects":[]}`))
	req.SetBasicAuth("alice", token)
	req.Header.Set("Content-Type", "application/vnd.git-lfs+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotImplemented || !strings.Contains(string(body), "--lfs-store") {
		t.Fatalf("LFS on a node without --lfs-store: %d %s", resp.StatusCode, body)
	}
}
