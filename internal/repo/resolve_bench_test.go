package repo

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"packwire/internal/gittest"
)

// benchRoot makes a root of 1000 repositories in dir: 500 at the top level
// and 10 groups of 50. Only what IsBare looks at is created.
func benchRoot(b *testing.B, dir string) Root {
	b.Helper()
	root := Root{Dir: dir}
	mk := func(name string) {
		p := root.PathFor(name)
		for _, d := range []string{"objects", "refs"} {
			if err := os.MkdirAll(filepath.Join(p, d), 0o755); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(p, "HEAD"), []byte("ref: refs/heads/main\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 500 {
		mk(fmt.Sprintf("repo%04d", i))
	}
	for g := range 10 {
		for i := range 50 {
			mk(fmt.Sprintf("team%02d/app%03d", g, i))
		}
	}
	return root
}

// BenchmarkResolve: the cost of resolving a name the client spelled as on
// disk, at the top of a root of 1000 repositories and one level down.
func BenchmarkResolve(b *testing.B) {
	root := benchRoot(b, b.TempDir())
	for _, name := range []string{"repo0250", "team05/app025.git"} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := root.Resolve(name); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkResolveCaseInsensitive: the same on a file system that folds
// case (exFAT through FUSE here), where every segment's directory is read:
// spelled as on disk, and spelled otherwise.
func BenchmarkResolveCaseInsensitive(b *testing.B) {
	root := benchRoot(b, gittest.CaseInsensitiveDir(b))
	for _, name := range []string{"repo0250", "REPO0250", "team05/app025.git", "TEAM05/APP025.git"} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := root.Resolve(name); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
