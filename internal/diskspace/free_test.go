package diskspace

import (
	"path/filepath"
	"testing"
)

// Free reads the real file system: some space is free, and not 4 EiB of it
// (-1 means this platform cannot tell).
func TestFree(t *testing.T) {
	free, err := Free(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if free != -1 && (free <= 0 || free >= 1<<62) {
		t.Fatalf("free = %d", free)
	}
}

// Enough reads the real file system: some space is free, and not 4 EiB of
// it; no bound is always enough.
func TestEnough(t *testing.T) {
	dir := t.TempDir()
	if !Enough(dir, 1) {
		free, err := Free(dir)
		t.Fatalf("Enough for 1 byte = false (free %d, %v)", free, err)
	}
	if Enough(dir, 1<<62) {
		t.Fatal("Enough for 4 EiB = true")
	}
	if !Enough(filepath.Join(dir, "missing"), 0) {
		t.Fatal("no bound is not enough")
	}
	if Enough(filepath.Join(dir, "missing"), 1) {
		t.Fatal("a directory whose free space cannot be read has enough")
	}
}

// Bound reports a change only when the answer flips.
func TestBound(t *testing.T) {
	dir := t.TempDir()
	var b Bound
	for i, c := range []struct {
		min             int64
		enough, changed bool
	}{
		{1, true, false}, {1 << 62, false, true}, {1 << 62, false, false}, {1, true, true}, {0, true, false},
	} {
		if enough, changed := b.Check(dir, c.min); enough != c.enough || changed != c.changed {
			t.Fatalf("check %d (min %d): enough %v changed %v, want %v %v", i, c.min, enough, changed, c.enough, c.changed)
		}
	}
}
