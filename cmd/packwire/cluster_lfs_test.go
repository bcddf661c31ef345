package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
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
// (weed) and the LFS index in PostgreSQL. The repository has one copy, so
// one node holds none: git-lfs pushes through that node (git's push is
// relayed, LFS is served there from the shared store and index) and
// clones through it. The objects follow the repository's name: renamed
// (served under the new name, not the old), deleted and restored, and
// once the deletion can no longer be restored the rows and the bucket's
// object go. A node without --lfs-store refuses LFS, naming the flag.
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
	admin("repo", "create", "team/lfs", "--replicas", "1")
	plain := startNodes(t, url, []string{"c"}, 200*time.Millisecond, time.Second, nil)["c"]
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var holder string
	if err := db.QueryRow("SELECT node FROM replicas WHERE repo = 'team/lfs'").Scan(&holder); err != nil {
		t.Fatal(err)
	}
	other := map[string]string{"a": "b", "b": "a"}[holder]
	token := aliceWrites(admin)
	remote := func(node, name string) string {
		return fmt.Sprintf("http://alice:%s@%s/%s", token, nodes[node].HTTPAddr, name)
	}
	env := nodes["a"].Env
	env.Git("", "lfs", "install", "--skip-repo")
	waitUntil(t, time.Minute, "team/lfs made on "+holder, func() bool {
		_, err := env.Run("", nil, "ls-remote", remote(holder, "team/lfs"))
		return err == nil
	})

	r := rand.New(rand.NewPCG(31, 31))
	content := make([]byte, 150<<10)
	for i := range content {
		content[i] = byte(r.Uint32())
	}
	sum := sha256.Sum256(content)
	oid := hex.EncodeToString(sum[:])
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "init", "-q", "-b", "main", w)
	env.Git(w, "lfs", "track", "*.bin")
	os.WriteFile(filepath.Join(w, "a.bin"), content, 0o644)
	env.Git(w, "add", ".")
	env.Git(w, "commit", "-qm", "lfs")
	if out, err := env.Run(w, nil, "push", remote(other, "team/lfs"), "main"); err != nil {
		t.Fatalf("push through %s, which holds no copy: %v\n%s", other, err, out)
	}
	if objects, _ := weed.Keys(t, bucket); len(objects) != 1 {
		t.Fatalf("bucket holds %v, want the one object", objects)
	}
	for _, node := range []string{other, holder} {
		c := filepath.Join(t.TempDir(), "c"+node)
		if out, err := env.Run("", nil, "clone", "-q", remote(node, "team/lfs"), c); err != nil {
			t.Fatalf("clone through %s: %v\n%s", node, err, out)
		}
		if got, _ := os.ReadFile(filepath.Join(c, "a.bin")); !bytes.Equal(got, content) {
			t.Fatalf("a.bin cloned through %s is %d bytes, not the content pushed", node, len(got))
		}
	}

	// served tells whether the batch API of every store node hands out the
	// object under name (true), or none does (false).
	served := func(name string) bool {
		t.Helper()
		var answers []string
		for _, node := range []string{"a", "b"} {
			status, body := lfsBatch(t, nodes[node].HTTPAddr, name, token, oid, len(content))
			answers = append(answers, fmt.Sprintf("%s: %d %s", node, status, body))
		}
		ok := func(a string) bool { return strings.Contains(a, ": 200 ") && strings.Contains(a, `"download"`) }
		if ok(answers[0]) != ok(answers[1]) {
			t.Fatalf("the nodes disagree on %s's object:\n%s", name, strings.Join(answers, "\n"))
		}
		return ok(answers[0])
	}
	if !served("team/lfs") {
		t.Fatal("the pushed object is not served through the batch API")
	}
	if out, code := packwire(t, "repo", "show", "team/lfs", "--data", nodes[holder].Data.Dir, "--database", url); code != 0 || !strings.Contains(out, "LFS objects: 1, 150.0 KiB") {
		t.Fatalf("repo show on %s: %d\n%s", holder, code, out)
	}
	admin("repo", "rename", "team/lfs", "team/renamed")
	if !served("team/renamed") || served("team/lfs") {
		t.Fatalf("after the rename: served under the new name %v, under the old %v", served("team/renamed"), served("team/lfs"))
	}
	admin("repo", "delete", "team/renamed")
	if served("team/renamed") {
		t.Fatal("the object of a deleted repository is still served")
	}
	// Refused until the holder has moved its copy into its trash.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		out, code := packwire(t, "repo", "restore", "team/renamed", "--data", filepath.Join(t.TempDir(), "none"), "--database", url)
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("repo restore: %d %s", code, out)
		}
	}
	if !served("team/renamed") {
		t.Fatal("the object of a restored repository is not served")
	}

	// Deleted for good: once no node's trash holds a copy (what each
	// node's trash expiry records, cluster.TrashRemoved), a sweep forgets
	// the rows and removes the object no repository holds.
	admin("repo", "delete", "team/renamed")
	waitUntil(t, time.Minute, "the copy in "+holder+"'s trash", func() bool {
		var n int
		db.QueryRow("SELECT count(*) FROM cluster_trash WHERE repo = 'team/renamed'").Scan(&n)
		return n == 1
	})
	ctx := context.Background()
	if _, _, err := nodes[other].LFS.Sweep(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if objects, _ := weed.Keys(t, bucket); len(objects) != 1 {
		t.Fatalf("a sweep removed the object of a restorable deletion: the bucket holds %v", objects)
	}
	if _, err := db.Exec("DELETE FROM cluster_trash WHERE repo = 'team/renamed'"); err != nil {
		t.Fatal(err)
	}
	if removed, _, err := nodes[other].LFS.Sweep(ctx, 0); err != nil || removed != 1 {
		t.Fatalf("sweep after the deletion expired: %d removed (%v)", removed, err)
	}
	var rows int
	db.QueryRow("SELECT count(*) FROM lfs.lfs_objects").Scan(&rows)
	if objects, _ := weed.Keys(t, bucket); len(objects) != 0 || rows != 0 {
		t.Fatalf("after the deletion expired: the bucket holds %v, the index %d rows", objects, rows)
	}

	// The node without the shared store refuses LFS and says why.
	if status, body := lfsBatch(t, plain.HTTPAddr, "team/renamed", token, oid, len(content)); status != http.StatusNotImplemented || !strings.Contains(body, "--lfs-store") {
		t.Fatalf("LFS on a node without --lfs-store: %d %s", status, body)
	}
}

// lfsBatch asks the batch API at addr, as alice (token), to download the
// object oid of size from repository name: the status and the body.
func lfsBatch(t *testing.T, addr net.Addr, name, token, oid string, size int) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://%s/%s.git/info/lfs/objects/batch", addr, name),
		strings.NewReader(fmt.Sprintf(`{"operation":"download","objects":[{"oid":"%s","size":%d}]}`, oid, size)))
	req.SetBasicAuth("alice", token)
	req.Header.Set("Content-Type", "application/vnd.git-lfs+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
