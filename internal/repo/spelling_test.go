package repo

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeDirs is a file system of directories only that folds case, as
// macOS and Windows do by default, or not. It counts the directory reads.
type fakeDirs struct {
	fold  bool
	tree  map[string][]string // directory -> entries as stored
	reads int
}

func (f *fakeDirs) find(path string) bool {
	dir, base := filepath.Dir(path), filepath.Base(path)
	for d, names := range f.tree {
		if d != dir && !(f.fold && strings.EqualFold(d, dir)) {
			continue
		}
		for _, n := range names {
			if n == base || f.fold && strings.EqualFold(n, base) {
				return true
			}
		}
	}
	return false
}

func (f *fakeDirs) Lstat(path string) (os.FileInfo, error) {
	if !f.find(path) {
		return nil, &fs.PathError{Op: "lstat", Path: path, Err: fs.ErrNotExist}
	}
	return fakeInfo(filepath.Base(path)), nil
}

func (f *fakeDirs) Names(dir string) ([]string, error) {
	f.reads++
	for d, names := range f.tree {
		if d == dir || f.fold && strings.EqualFold(d, dir) {
			return names, nil
		}
	}
	return nil, fs.ErrNotExist
}

type fakeInfo string

func (i fakeInfo) Name() string       { return string(i) }
func (i fakeInfo) Size() int64        { return 0 }
func (i fakeInfo) Mode() fs.FileMode  { return fs.ModeDir | 0o755 }
func (i fakeInfo) ModTime() time.Time { return time.Time{} }
func (i fakeInfo) IsDir() bool        { return true }
func (i fakeInfo) Sys() any           { return nil }

// TestOnDiskSpelling: on a file system that folds case, each segment is
// spelled as stored, whatever the client sent; on one that does not, two
// case variants are distinct and the directory is never read.
func TestOnDiskSpelling(t *testing.T) {
	tree := map[string][]string{
		"/r":             {"team", "Other.git", "1234.git", "repo0001.git"},
		"/r/team":        {"secret.git", "App.git"},
		"/r/team/Nested": {},
	}
	folding := &fakeDirs{fold: true, tree: tree}
	for rel, want := range map[string]string{
		"TEAM/SECRET.GIT": "team/secret.git",
		"Team/secret.git": "team/secret.git",
		"team/app.git":    "team/App.git",
		"other.git":       "Other.git",
		"OTHER.GIT":       "Other.git",
		"team/App.git":    "team/App.git", // exact
		"1234.git":        "1234.git",
	} {
		got, err := onDiskSpelling(folding, "/r", filepath.FromSlash(rel))
		if err != nil || filepath.ToSlash(got) != want {
			t.Errorf("folding: %q -> %q, %v; want %q", rel, got, err, want)
		}
	}

	// Case-sensitive, both variants present: each is itself.
	sensitive := &fakeDirs{tree: map[string][]string{"/r": {"team", "Team"}, "/r/team": {"a.git"}, "/r/Team": {"a.git"}}}
	for _, rel := range []string{"team/a.git", "Team/a.git"} {
		if got, err := onDiskSpelling(sensitive, "/r", filepath.FromSlash(rel)); err != nil || filepath.ToSlash(got) != rel {
			t.Errorf("case-sensitive: %q -> %q, %v", rel, got, err)
		}
	}
	// Case-sensitive, one variant: one failed Lstat per segment, no read.
	plain := &fakeDirs{tree: map[string][]string{"/r": {"team"}, "/r/team": {"a.git"}}}
	if got, err := onDiskSpelling(plain, "/r", filepath.FromSlash("team/a.git")); err != nil || filepath.ToSlash(got) != "team/a.git" || plain.reads != 0 {
		t.Errorf("case-sensitive: %q, %v, %d directory reads", got, err, plain.reads)
	}
	// A folding lookup that two entries would answer (cannot happen on a
	// real file system) fails closed.
	odd := &fakeDirs{fold: true, tree: map[string][]string{"/r": {"Team", "tEAM"}}}
	if got, err := onDiskSpelling(odd, "/r", "team"); err == nil {
		t.Errorf("ambiguous: %q", got)
	}
}
