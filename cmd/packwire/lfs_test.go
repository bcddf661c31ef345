package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"packwire/internal/backup"
	"packwire/internal/lfs"
	"packwire/internal/s3test"
)

// TestRepoShowLFS: repo show prints the LFS objects a repository holds
// and their bytes, and none for a data directory where LFS never ran.
func TestRepoShowLFS(t *testing.T) {
	data := newData(t)
	for _, name := range []string{"app", "other"} {
		if out, code := packwire(t, "repo", "create", name, "--data", data); code != 0 {
			t.Fatalf("repo create: %d %s", code, out)
		}
	}
	if out, code := packwire(t, "repo", "show", "app", "--data", data); code != 0 || !strings.Contains(out, "LFS objects: 0, 0 B") {
		t.Fatalf("repo show before LFS: %d\n%s", code, out)
	}
	ctx := context.Background()
	s, err := lfs.Open(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	content := bytes.Repeat([]byte("x"), 3000)
	sum := sha256.Sum256(content)
	oid := hex.EncodeToString(sum[:])
	if _, err := s.Objects.Put(oid, int64(len(content)), bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if err := s.Index.Add(ctx, "app", oid, int64(len(content))); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if out, code := packwire(t, "repo", "show", "app", "--data", data); code != 0 || !strings.Contains(out, "LFS objects: 1, 2.9 KiB") {
		t.Fatalf("repo show: %d\n%s", code, out)
	}
	if out, code := packwire(t, "repo", "show", "other", "--data", data); code != 0 || !strings.Contains(out, "LFS objects: 0, 0 B") {
		t.Fatalf("repo show of a repository without LFS objects: %d\n%s", code, out)
	}

	// The objects follow the repository: renamed, deleted (a new
	// repository of the name holds none), restored.
	if out, code := packwire(t, "repo", "rename", "app", "renamed", "--data", data); code != 0 {
		t.Fatalf("repo rename: %d %s", code, out)
	}
	if out, _ := packwire(t, "repo", "show", "renamed", "--data", data); !strings.Contains(out, "LFS objects: 1,") {
		t.Fatalf("repo show after rename:\n%s", out)
	}
	if out, code := packwire(t, "repo", "delete", "renamed", "--data", data); code != 0 {
		t.Fatalf("repo delete: %d %s", code, out)
	}
	packwire(t, "repo", "create", "renamed", "--data", data)
	if out, _ := packwire(t, "repo", "show", "renamed", "--data", data); !strings.Contains(out, "LFS objects: 0,") {
		t.Fatalf("a new repository of a deleted one's name holds its LFS objects:\n%s", out)
	}
	packwire(t, "repo", "delete", "renamed", "--data", data)
	if out, code := packwire(t, "repo", "restore", "renamed", "--at", firstStamp(t, data), "--data", data); code != 0 {
		t.Fatalf("repo restore: %d %s", code, out)
	}
	if out, _ := packwire(t, "repo", "show", "renamed", "--data", data); !strings.Contains(out, "LFS objects: 1,") {
		t.Fatalf("repo show after restore:\n%s", out)
	}

	// maintain removing the deleted repository from the trash for good lets
	// go of its objects (the sweep then removes the content).
	// Deletions of one name within a second are stamped a second apart
	// (repo.MoveToTrash), so the last may be stamped ahead of the clock
	// and expire only once the clock passes it: maintain runs until then.
	packwire(t, "repo", "delete", "renamed", "--data", data)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, code := packwire(t, "maintain", "--trash-retention", "1ns", "--data", data)
		if code != 0 {
			t.Fatalf("maintain --trash-retention: %d\n%s", code, out)
		}
		if s, err = lfs.Open(ctx, data); err != nil {
			t.Fatal(err)
		}
		held, err := s.Index.Held(ctx, oid)
		s.Close()
		if err == nil && !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after maintain expired the trash, the index still holds the object (%v)\n%s", err, out)
		}
	}
}

// firstStamp is the oldest deletion in the trash, as repo trash lists it.
func firstStamp(t *testing.T, data string) string {
	t.Helper()
	out, code := packwire(t, "repo", "trash", "--data", data)
	fields := strings.Fields(out)
	if code != 0 || len(fields) < 2 {
		t.Fatalf("repo trash: %d %s", code, out)
	}
	stamps := []string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		stamps = append(stamps, strings.Fields(line)[1])
	}
	slices.Sort(stamps)
	return stamps[0]
}

// TestBackupLFSS3: the LFS objects of a server whose store is a bucket of
// a real S3 server (weed) are not copied into a backup but checked and
// recorded: backup without --lfs-store refuses (its index names objects
// the backup would not hold), with it the manifest names the store;
// restore checks the store holds every object and refuses, naming the
// object, once one is gone.
func TestBackupLFSS3(t *testing.T) {
	t.Parallel()
	weed := s3test.Shared(t)
	bucket := weed.NewBucket(t)
	storeURL := weed.StoreURL(t, bucket)
	data := newData(t)
	ctx := context.Background()
	s, err := lfs.OpenStore(ctx, data, storeURL, "")
	if err != nil {
		t.Fatal(err)
	}
	content := bytes.Repeat([]byte("s3 object "), 300)
	sum := sha256.Sum256(content)
	oid := hex.EncodeToString(sum[:])
	if _, err := s.Objects.Put(oid, int64(len(content)), bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	if err := s.Index.Add(ctx, "app", oid, int64(len(content))); err != nil {
		t.Fatal(err)
	}
	s.Close()

	dir := t.TempDir()
	if out, code := packwire(t, "backup", "--data", data, filepath.Join(dir, "plain")); code == 0 || !strings.Contains(out, "1 of them are not in the backup") || !strings.Contains(out, "--lfs-store") {
		t.Fatalf("backup of a server with its LFS objects in S3, without --lfs-store: %d\n%s", code, out)
	}
	backupDir := filepath.Join(dir, "b")
	if out, code := packwire(t, "backup", "--data", data, "--lfs-store", storeURL, backupDir); code != 0 || !strings.Contains(out, "1 objects, all in") {
		t.Fatalf("backup --lfs-store: %d\n%s", code, out)
	}
	if m, err := backup.ReadManifest(backupDir); err != nil || m.LFSStore != storeURL || m.LFSObjects != 1 {
		t.Fatalf("manifest: %+v (%v)", m, err)
	}
	restored := filepath.Join(dir, "restored")
	if out, code := packwire(t, "restore", backupDir, "--data", restored); code != 0 {
		t.Fatalf("restore: %d\n%s", code, out)
	}
	if n, _, err := lfs.RepoUsage(ctx, restored, "app"); err != nil || n != 1 {
		t.Fatalf("restored index: %d objects (%v)", n, err)
	}
	s3, err := lfs.OpenS3(ctx, storeURL)
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Remove(oid); err != nil {
		t.Fatal(err)
	}
	lost := filepath.Join(dir, "lost")
	if out, code := packwire(t, "restore", backupDir, "--data", lost); code == 0 || !strings.Contains(out, oid) {
		t.Fatalf("restore with the bucket's object gone: %d\n%s", code, out)
	}
	if _, err := os.Stat(lost); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused restore left %s (%v)", lost, err)
	}
}
