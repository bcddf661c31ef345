package packcache

import (
	"context"
	"errors"
	"fmt"
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
	if o := c.TakeOutcome("rq1"); o.Outcome != Direct || o.UserCPU+o.SysCPU != 0 {
		t.Fatalf("outcome %+v", o)
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

// slowPackObjects is a stand-in for git that writes 40 chunks of 64 KiB
// with pauses, so readers overlap for certain and one can leave mid-stream.
func slowPackObjects(t *testing.T) string {
	t.Helper()
	script := filepath.Join(t.TempDir(), "git")
	os.WriteFile(script, []byte("#!/bin/sh\ncat >/dev/null\ni=0\nwhile [ $i -lt 40 ]; do head -c 65536 /dev/zero | tr '\\\\0' \"$i\"; sleep 0.01; i=$((i+1)); done\n"), 0o755)
	return script
}

func TestSharedRunSurvivesAReaderLeaving(t *testing.T) {
	c := newCache(t)
	c.MaxBytes = 100 << 20
	c.GitPath = slowPackObjects(t)
	req := Request{RepoPath: t.TempDir(), Args: []string{"git", "pack-objects", "--stdout"}}
	type result struct {
		outcome Outcome
		n       int
		err     error
	}
	results := make(chan result, 3)
	leaverCtx, leave := context.WithCancel(context.Background())
	defer leave()
	for i := 0; i < 3; i++ {
		ctx := context.Background()
		if i == 0 {
			ctx = leaverCtx
		}
		r := req
		r.RequestID = fmt.Sprint("rq", i)
		go func() {
			var out countingWriter
			if i == 0 {
				out.after, out.do = 1<<20, leave // leave once 1 MiB has arrived
			}
			o, err := c.Serve(ctx, r, []byte("want x\n"), &out)
			results <- result{o, out.n, err}
		}()
		time.Sleep(20 * time.Millisecond)
	}
	outcomes := map[Outcome]int{}
	for i := 0; i < 3; i++ {
		r := <-results
		outcomes[r.outcome]++
		if r.err == nil && r.n != 40*65536 {
			t.Errorf("a reader got %d bytes", r.n)
		}
		if r.err != nil && !errors.Is(r.err, context.Canceled) {
			t.Errorf("reader error: %v", r.err)
		}
	}
	if outcomes[Generated] != 1 || outcomes[Joined] != 2 {
		t.Fatalf("outcomes %v", outcomes)
	}
	// The run finished for the others and was kept: the next identical request hits.
	var out countingWriter
	if o, err := c.Serve(context.Background(), req, []byte("want x\n"), &out); o != Hit || err != nil || out.n != 40*65536 {
		t.Fatalf("after the run: %s %v %d", o, err, out.n)
	}
	// Only git pack-objects --stdout is served.
	bad := req
	bad.Args = []string{"sh", "pack-objects", "--stdout"}
	if _, err := c.Serve(context.Background(), bad, nil, io.Discard); !errors.Is(err, ErrStandAside) {
		t.Fatalf("argv[0] from the hook was accepted: %v", err)
	}
}

type countingWriter struct {
	n     int
	after int
	do    func()
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	if w.do != nil && w.n >= w.after {
		w.do()
		w.do = nil
	}
	return len(p), nil
}

// TestExpiredPackIsReplacedNotLeaked: a pack past MaxAge is regenerated,
// and the old one's file and size are gone, not counted twice.
func TestExpiredPackIsReplacedNotLeaked(t *testing.T) {
	c := newCache(t)
	c.MaxBytes = 100 << 20
	c.MaxAge = 50 * time.Millisecond
	c.GitPath = slowPackObjects(t)
	req := Request{RepoPath: t.TempDir(), Args: []string{"git", "pack-objects", "--stdout"}}
	const size = 40 * 65536
	for i, want := range []Outcome{Generated, Hit} {
		if o, err := c.Serve(context.Background(), req, []byte("want x\n"), io.Discard); o != want || err != nil {
			t.Fatalf("request %d: %s %v", i, o, err)
		}
	}
	time.Sleep(60 * time.Millisecond)
	if o, err := c.Serve(context.Background(), req, []byte("want x\n"), io.Discard); o != Generated || err != nil {
		t.Fatalf("after expiry: %s %v", o, err)
	}
	packs, bytes, _ := c.Stats()
	files, _ := filepath.Glob(filepath.Join(c.Dir, "*.pack"))
	if packs != 1 || bytes != size || len(files) != 1 {
		t.Fatalf("after replacing an expired pack: %d packs, %d bytes, files %v", packs, bytes, files)
	}
}

// TestSetBounds: a larger bound keeps every finished pack; a smaller one
// drops the least recently used down to it at once, file and all.
func TestSetBounds(t *testing.T) {
	c := newCache(t)
	start, tick := time.Now(), 0
	c.done.Now = func() time.Time { tick++; return start.Add(time.Duration(tick) * time.Millisecond) } // each add later than the last
	add := func(key string, size int) {
		path := filepath.Join(c.Dir, key+".pack")
		if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		c.doneLocked().Add(key, path, int64(size))
		c.mu.Unlock()
	}
	add("old", 40)
	add("new", 40)
	c.SetBounds(Bounds{MaxBytes: 200, MaxAge: time.Hour})
	add("newest", 40)
	if packs, bytes, _ := c.Stats(); packs != 3 || bytes != 120 {
		t.Fatalf("after a larger bound: %d packs, %d bytes; want all 3 kept", packs, bytes)
	}
	c.SetBounds(Bounds{MaxBytes: 90, MaxAge: time.Hour})
	files, _ := filepath.Glob(filepath.Join(c.Dir, "*.pack"))
	if packs, bytes, _ := c.Stats(); packs != 2 || bytes != 80 || len(files) != 2 {
		t.Fatalf("after a smaller bound: %d packs, %d bytes, files %v", packs, bytes, files)
	}
	if _, err := os.Stat(filepath.Join(c.Dir, "old.pack")); !os.IsNotExist(err) {
		t.Fatalf("the least recently used pack is still there: %v", err)
	}
	if c.MinUses != 1 {
		t.Fatalf("MinUses 0 became %d, want 1", c.MinUses)
	}
}
