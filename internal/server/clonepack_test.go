package server

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"packwire/internal/clonepack"
	"packwire/internal/fetchcache"
	"packwire/internal/governor"
	"packwire/internal/maintain"
)

// objectSet lists every object id of a repository, sorted.
func (s *testServer) objectSet(t *testing.T, dir string) []string {
	t.Helper()
	ids := strings.Fields(s.env.Git(dir, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)"))
	slices.Sort(ids)
	return ids
}

// sameObjects fails unless clone holds exactly the objects of a clone of
// bare served by pack-objects.
func (s *testServer) sameObjects(t *testing.T, bare, clone string) {
	t.Helper()
	reference := filepath.Join(t.TempDir(), "reference")
	s.env.Git("", "clone", "-q", "--bare", "--no-local", bare, reference)
	if got, want := s.objectSet(t, clone), s.objectSet(t, reference); !slices.Equal(got, want) {
		t.Fatalf("the clone has %d objects, pack-objects' clone %d", len(got), len(want))
	}
}

// TestClonePackFileEveryTransport: over git://, SSH and HTTP, each with
// protocol v0 and v2, a full clone of a maintained repository is answered
// from its preferred pack: the governor records clone-pack-file, the
// clone started no git beyond a v0 session's own (which only advertises),
// it is fsck-clean and holds the very objects a clone served by
// pack-objects holds. The fetch cache stores nothing here (MaxBytes 0), so
// every clone is cold. After a push the pack is spliced with a thin pack
// of the push (clone-splice), and the clone has the push and the same
// objects; after a branch is rewound git answers (generated).
func TestClonePackFileEveryTransport(t *testing.T) {
	t.Parallel() // it counts its own server's gits (Pipeline.GitStarts)
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, func(c *Config) {
		enableSSH(c)
		c.FetchCacheMaxBytes = 0 // no replays: every clone leads
		c.MaintainInterval = 0
	})
	sshEnv := sshEnvFor(s)
	ctx := context.Background()
	for _, tc := range transportCases(s, sshEnv) {
		t.Run(tc.name, func(t *testing.T) {
			name := "fast/" + tc.name
			bare := s.seed(t, name)
			r, err := s.Data.Repos.Resolve(name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Maintainer.Run(ctx, r, maintain.Full, "test"); err != nil {
				t.Fatal(err)
			}
			clone := func(what, outcome string) (string, int64, governor.Record) {
				t.Helper()
				settle(t, bare)
				seq := s.lastSeq(t)
				starts := s.Pipeline.GitStarts()
				dir := filepath.Join(t.TempDir(), "c")
				tc.run(t, s, "", "clone", "-q", "--bare", tc.url(name), dir)
				started := s.Pipeline.GitStarts() - starts
				rec := s.fetchRecords(t, seq, "full-clone", 1)[0]
				if rec.PackCache != outcome || rec.Result != governor.ResultOK {
					t.Fatalf("%s: record %s/%s, want %s/ok", what, rec.PackCache, rec.Result, outcome)
				}
				if out, err := s.env.Run(dir, nil, "fsck", "--full", "--strict", "--no-dangling"); err != nil {
					t.Fatalf("%s: fsck: %v\n%s", what, err, out)
				}
				return dir, started, rec
			}
			clone("first clone", clonepack.Outcome) // its advertisement may run git; later ones are kept
			dir, started, rec := clone("second clone", clonepack.Outcome)
			sessionGit := int64(0)
			if tc.version == 0 && !strings.HasPrefix(tc.name, "http") {
				sessionGit = 1 // the v0 session's upload-pack, which advertises and gets no wants
			}
			if started != sessionGit {
				t.Fatalf("the clone from the preferred pack started %d gits, want %d", started, sessionGit)
			}
			if sessionGit == 0 && rec.CPU() != 0 {
				t.Fatalf("the clone from the preferred pack has git CPU: %+v", rec)
			}
			if rec.BytesOut < packSize(t, bare) {
				t.Fatalf("record says %d bytes out, the preferred pack has %d", rec.BytesOut, packSize(t, bare))
			}
			s.sameObjects(t, bare, dir)

			// A push that only adds: the preferred pack spliced with a thin
			// pack of the push (git selects the new objects, nothing else).
			head := pushCommit(t, s, name, "pushed.txt")
			after, _, rec := clone("clone after a push", clonepack.SpliceOutcome)
			if rec.CPU() == 0 {
				t.Fatalf("the splice's record has no git CPU: %+v", rec)
			}
			if got := s.env.RevParse(after, "main"); got != head {
				t.Fatalf("clone after a push has main at %s, want %s", got, head)
			}
			s.sameObjects(t, bare, after)

			// A branch rewound: the pack holds what no clone wants; git.
			s.env.Git(bare, "update-ref", "refs/heads/branch0", "branch0~1")
			rewound, started, _ := clone("clone after a rewind", fetchcache.Generated)
			if started <= sessionGit {
				t.Fatalf("the clone after a rewind started %d gits: git did not answer", started)
			}
			s.sameObjects(t, bare, rewound)
		})
	}
}

// packSize is the size of the repository's preferred pack.
func packSize(t *testing.T, bare string) int64 {
	t.Helper()
	l, err := maintain.Inspect(bare)
	if err != nil || l.PreferredPack() == nil {
		t.Fatalf("no preferred pack in %s (%v)", bare, err)
	}
	fi, err := os.Stat(filepath.Join(bare, "objects", "pack", l.PreferredPack().Name))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
