package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"packwire/internal/lfs"
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
}
