package packcache

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func newCache(t *testing.T) *Cache {
	t.Helper()
	c := &Cache{Dir: filepath.Join(t.TempDir(), "packs"), MaxBytes: 100, MaxAge: time.Hour}
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestStandsAsideWhenFilesCannotBeMade(t *testing.T) {
	c := newCache(t)
	c.createFile = func(string) (*os.File, error) { return nil, errors.New("no space left on device") }
	req := Request{RequestID: "rq1", Args: []string{"git", "pack-objects", "--stdout"}}
	if _, err := c.Serve(context.Background(), req, []byte("x"), io.Discard); !errors.Is(err, ErrStandAside) {
		t.Fatalf("got %v", err)
	}
	if o := c.TakeOutcome("rq1"); o != Direct {
		t.Fatalf("outcome %q", o)
	}
	// Not a --stdout pack-objects: nothing to share.
	if _, err := c.Serve(context.Background(), Request{Args: []string{"git", "pack-objects", "dir/prefix"}}, nil, io.Discard); !errors.Is(err, ErrStandAside) {
		t.Fatalf("got %v", err)
	}
}

func TestKeyCoversInputs(t *testing.T) {
	c := newCache(t)
	base := Request{RepoPath: "/r", Args: []string{"git", "pack-objects", "--stdout"}, Config: "'a'='b'"}
	k := c.Key(base, []byte("want 1"))
	variants := []func(*Request) []byte{
		func(r *Request) []byte { r.RepoPath = "/other"; return []byte("want 1") },
		func(r *Request) []byte { r.Args = append(r.Args, "--thin"); return []byte("want 1") },
		func(r *Request) []byte { r.Config = "'a'='c'"; return []byte("want 1") },
		func(r *Request) []byte { return []byte("want 2") },
	}
	for i, v := range variants {
		r := base
		r.Args = append([]string{}, base.Args...)
		if c.Key(r, v(&r)) == k {
			t.Errorf("variant %d has the same key", i)
		}
	}
	c.GitVersion = "git version 9"
	if c.Key(base, []byte("want 1")) == k {
		t.Error("the git version is not part of the key")
	}
}

func TestEvictsLeastRecentlyUsed(t *testing.T) {
	c := newCache(t)
	now := time.Now()
	for i, name := range []string{"old", "mid", "new"} {
		p := filepath.Join(c.Dir, name+".pack")
		os.WriteFile(p, make([]byte, 40), 0o600)
		c.done[name] = &entry{path: p, size: 40, created: now, lastUsed: now.Add(time.Duration(i) * time.Second)}
		c.total += 40
	}
	c.evictLocked()
	if _, ok := c.done["old"]; ok || c.total != 80 {
		t.Fatalf("kept %v, total %d", c.done, c.total)
	}
	if _, err := os.Stat(filepath.Join(c.Dir, "old.pack")); err == nil {
		t.Fatal("evicted file still on disk")
	}
	c.MaxAge = time.Nanosecond
	c.Expire()
	if len(c.done) != 0 || c.total != 0 {
		t.Fatalf("expired packs kept: %v", c.done)
	}
}
