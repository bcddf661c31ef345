package filelru

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// put writes a file of size bytes and stores it under key.
func put(t *testing.T, s *Set, dir, key string, size int) string {
	t.Helper()
	p := filepath.Join(dir, key)
	if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	s.Add(key, p, int64(size))
	return p
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func TestEvictsLeastRecentlyUsed(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1_000_000, 0)
	s := &Set{MaxBytes: 100, Now: func() time.Time { return now }}
	old := put(t, s, dir, "old", 40)
	now = now.Add(time.Second)
	put(t, s, dir, "mid", 40)
	now = now.Add(time.Second)
	if _, _, ok := s.Lookup("old"); !ok { // old is now the most recently used
		t.Fatal("old is not stored")
	}
	now = now.Add(time.Second)
	put(t, s, dir, "new", 40) // 120 > 100: mid goes
	if _, _, ok := s.Lookup("mid"); ok || s.Len() != 2 || s.Bytes() != 80 {
		t.Fatalf("after eviction: mid kept %v, %d entries, %d bytes", ok, s.Len(), s.Bytes())
	}
	if exists(filepath.Join(dir, "mid")) || !exists(old) {
		t.Fatal("eviction removed the wrong file")
	}
	big := put(t, s, dir, "big", 101)
	if _, _, ok := s.Lookup("big"); ok || exists(big) {
		t.Fatal("an entry larger than MaxBytes was kept")
	}
}

func TestMaxAge(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1_000_000, 0)
	s := &Set{MaxBytes: 1 << 20, MaxAge: time.Minute, Now: func() time.Time { return now }}
	a := put(t, s, dir, "a", 10)
	now = now.Add(30 * time.Second)
	put(t, s, dir, "b", 10)
	now = now.Add(31 * time.Second) // a is 61 s old, b 31 s
	if _, _, ok := s.Lookup("a"); ok || exists(a) {
		t.Fatal("an entry past MaxAge was returned or left on disk")
	}
	if _, _, ok := s.Lookup("b"); !ok {
		t.Fatal("an entry within MaxAge was dropped")
	}
	now = now.Add(time.Hour)
	s.Evict()
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Fatalf("after Evict past MaxAge: %d entries, %d bytes", s.Len(), s.Bytes())
	}

	// MaxAge 0: no age limit.
	s = &Set{MaxBytes: 1 << 20, Now: func() time.Time { return now }}
	put(t, s, dir, "c", 10)
	now = now.Add(1000 * time.Hour)
	if _, _, ok := s.Lookup("c"); !ok {
		t.Fatal("MaxAge 0 dropped an entry by age")
	}
}

// TestReplace: storing a key again counts it once, and a new file at the
// same path (a cache renames its finished file over the key's name) is
// not removed with the old entry.
func TestReplace(t *testing.T) {
	dir := t.TempDir()
	s := &Set{MaxBytes: 100}
	p := put(t, s, dir, "k", 30)
	put(t, s, dir, "k", 50) // same path, rewritten
	if s.Len() != 1 || s.Bytes() != 50 || !exists(p) {
		t.Fatalf("after rewriting k in place: %d entries, %d bytes, file kept %v", s.Len(), s.Bytes(), exists(p))
	}
	other := filepath.Join(dir, "k2")
	os.WriteFile(other, make([]byte, 20), 0o600)
	s.Add("k", other, 20) // another path: the old file goes
	if s.Bytes() != 20 || exists(p) || !exists(other) {
		t.Fatalf("after moving k: %d bytes, old file kept %v", s.Bytes(), exists(p))
	}
	s.DropIfPath("k", p) // stale path: k stays
	if _, _, ok := s.Lookup("k"); !ok {
		t.Fatal("DropIfPath dropped a newer file")
	}
	s.DropIfPath("k", other)
	if _, _, ok := s.Lookup("k"); ok || exists(other) || s.Bytes() != 0 {
		t.Fatal("DropIfPath did not drop the entry it named")
	}
}
