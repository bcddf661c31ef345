package lfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"testing/iotest"
)

func oidOf(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func openTest(t *testing.T) *Service {
	t.Helper()
	s, err := Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// leftovers lists the files under the store's tmp directory.
func leftovers(t *testing.T, d *Disk) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(d.Dir, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestPut: a good upload is stored whole; a short, long, wrong or broken
// one is refused and leaves nothing, not even its temporary file.
func TestPut(t *testing.T) {
	s := openTest(t)
	content := bytes.Repeat([]byte("lfs "), 5000)
	oid := oidOf(content)
	cases := []struct {
		name string
		size int64
		body io.Reader
		want error
	}{
		{"short", int64(len(content)), bytes.NewReader(content[:100]), ErrSizeMismatch},
		{"long", int64(len(content)) - 1, bytes.NewReader(content), ErrSizeMismatch},
		{"wrong", int64(len(content)), bytes.NewReader(bytes.Repeat([]byte("LFS "), 5000)), ErrHashMismatch},
		{"broken", int64(len(content)), io.MultiReader(bytes.NewReader(content[:10]), iotest.ErrReader(io.ErrUnexpectedEOF)), io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		if _, err := s.Objects.Put(oid, c.size, c.body); !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want)
		}
		if _, ok := s.Objects.Stat(oid); ok {
			t.Fatalf("%s: the object is there", c.name)
		}
		if l := leftovers(t, s.Objects.(*Disk)); len(l) != 0 {
			t.Fatalf("%s: left %v", c.name, l)
		}
	}
	if n, err := s.Objects.Put(oid, int64(len(content)), bytes.NewReader(content)); err != nil || n != int64(len(content)) {
		t.Fatalf("good upload: %d %v", n, err)
	}
	f, _, err := s.Objects.Open(oid)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if !bytes.Equal(got, content) {
		t.Fatal("stored content differs")
	}
}

// TestSweep: content no repository holds goes; content one holds stays,
// and so does content younger than the grace period.
func TestSweep(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	held, loose := []byte("held"), []byte("loose")
	for _, b := range [][]byte{held, loose} {
		if _, err := s.Objects.Put(oidOf(b), int64(len(b)), bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Index.Add(ctx, "app", oidOf(held), int64(len(held))); err != nil {
		t.Fatal(err)
	}
	if n, _, err := s.Sweep(ctx, SweepGrace); err != nil || n != 0 {
		t.Fatalf("sweep within the grace period removed %d (%v)", n, err)
	}
	if n, _, err := s.Sweep(ctx, 0); err != nil || n != 1 {
		t.Fatalf("sweep removed %d (%v), want 1", n, err)
	}
	if _, ok := s.Objects.Stat(oidOf(held)); !ok {
		t.Fatal("a held object was removed")
	}
	if _, ok := s.Objects.Stat(oidOf(loose)); ok {
		t.Fatal("an object no repository holds stayed")
	}
}

func TestParsePointer(t *testing.T) {
	oid := oidOf([]byte("x"))
	good := "version https://git-lfs.github.com/spec/v1\noid sha256:" + oid + "\nsize 12345\n"
	if p, ok := ParsePointer([]byte(good)); !ok || p.OID != oid || p.Size != 12345 {
		t.Fatalf("good pointer: %+v %v", p, ok)
	}
	for _, bad := range []string{
		"",
		"version https://git-lfs.github.com/spec/v1\nsize 1\n",                              // no oid
		"version https://git-lfs.github.com/spec/v1\noid sha256:" + oid + "\n",              // no size
		"version https://git-lfs.github.com/spec/v1\noid sha256:" + oid[:60] + "\nsize 1\n", // short oid
		"version https://git-lfs.github.com/spec/v1\noid md5:" + oid + "\nsize 1\n",
		"hello\n" + good,
	} {
		if _, ok := ParsePointer([]byte(bad)); ok {
			t.Fatalf("parsed %q as a pointer", bad)
		}
	}
}

// The push check's first pass looks at the pushed objects only (the
// quarantine, not the repository's objects it borrows as an alternate):
// no pointer among them, nothing more to do; a pointer, found.
func TestPushedPointer(t *testing.T) {
	repoDir := filepath.Join(t.TempDir(), "r.git")
	if out, err := exec.Command("git", "init", "-q", "--bare", repoDir).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	quarantine := t.TempDir()
	store := func(objects string, content []byte) {
		cmd := exec.Command("git", "hash-object", "-w", "--stdin")
		cmd.Env = append(os.Environ(), "GIT_DIR="+repoDir, "GIT_OBJECT_DIRECTORY="+objects)
		cmd.Stdin = bytes.NewReader(content)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git hash-object: %v\n%s", err, out)
		}
	}
	pointer := []byte("version https://git-lfs.github.com/spec/v1\noid sha256:" + oidOf([]byte("x")) + "\nsize 1\n")
	store(filepath.Join(repoDir, "objects"), pointer) // already in the repository
	store(quarantine, []byte("a small file\n"))
	store(quarantine, bytes.Repeat([]byte("large "), 1000))
	t.Setenv("GIT_DIR", repoDir)
	t.Setenv("GIT_OBJECT_DIRECTORY", quarantine)
	t.Setenv("GIT_ALTERNATE_OBJECT_DIRECTORIES", filepath.Join(repoDir, "objects"))
	if found, err := pushedPointer(context.Background(), quarantine); err != nil || found {
		t.Fatalf("push without a pointer: found %v, %v", found, err)
	}
	store(quarantine, []byte("version https://git-lfs.github.com/spec/v1\noid sha256:"+oidOf([]byte("y"))+"\nsize 1\n"))
	if found, err := pushedPointer(context.Background(), quarantine); err != nil || !found {
		t.Fatalf("push with a pointer: found %v, %v", found, err)
	}
}
