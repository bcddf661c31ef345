package server

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/gittest"
)

// cloneOutcomes waits for n full-clone records after seq and counts them
// by "pack_cache/result".
func (s *testServer) cloneOutcomes(t *testing.T, seq int64, n int) map[string]int {
	t.Helper()
	return outcomeCounts(s.fetchRecords(t, seq, "full-clone", n))
}

func packNames(t *testing.T, clone string) string {
	t.Helper()
	entries, err := filepath.Glob(filepath.Join(clone, ".git", "objects", "pack", "*.pack"))
	if err != nil || len(entries) != 1 {
		t.Fatalf("clone %s has packs %v", clone, entries)
	}
	return filepath.Base(entries[0])
}

// TestPackSharing: identical concurrent clones over every transport get
// byte-identical packs from a single pack-objects run; a later identical
// clone is served from the cache; a new commit makes a new key.
func TestPackSharing(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, func(c *Config) { enableSSH(c); c.PackCache, c.FetchCache, c.MetricsPublic = true, false, true })
	sshEnv := sshEnvFor(s)
	r, _ := s.Data.Repos.Create(context.Background(), "big")
	s.env.Build(r.Path, gittest.Shape{Commits: 10, Files: 20, BlobBytes: 256 << 10, Incompress: true, Seed: 4})
	urls := []string{s.gitURL("big"), s.httpURL("big"), s.sshURL("big"), s.gitURL("big"), s.httpURL("big"), s.sshURL("big")}

	herd := func(urls []string) []string {
		seq := s.lastSeq(t)
		dirs := make([]string, len(urls))
		var wg sync.WaitGroup
		errs := make(chan string, len(urls))
		for i, url := range urls {
			dirs[i] = filepath.Join(t.TempDir(), "c")
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Protocol v0 and v2 ask pack-objects differently; keep one.
				if out, err := s.env.Run("", append([]string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=protocol.version", "GIT_CONFIG_VALUE_0=2"}, sshEnv...), "clone", "-q", url, dirs[i]); err != nil {
					errs <- url + ": " + err.Error() + " " + out
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatal(e)
		}
		recs := s.fetchRecords(t, seq, "full-clone", len(urls))
		got := outcomeCounts(recs)
		t.Logf("outcomes: %v", got)
		if got["generated/ok"] != 1 || got["generated/ok"]+got["joined/ok"]+got["hit/ok"] != len(urls) {
			t.Fatalf("identical clones: %v, want one pack-objects run, the others joining it or hitting its pack", got)
		}
		// pack-objects runs as the server's child, not upload-pack's: its
		// CPU is charged to the request that started the run, which then
		// costs a reader's share plus pack-objects'.
		var generated, least time.Duration
		for _, r := range recs {
			cpu := time.Duration(r.UserCPU + r.SysCPU)
			if r.PackCache == "generated" {
				generated = cpu
			} else if least == 0 || cpu < least {
				least = cpu
			}
		}
		if packObjects := packObjectsCPU(t, s, "big"); generated < least+packObjects/3 {
			t.Fatalf("the generating request's git CPU %v, a reader's from %v, pack-objects alone %v: pack-objects' CPU is not in the record", generated, least, packObjects)
		}
		return dirs
	}

	dirs := herd(urls)
	first := packNames(t, dirs[0])
	for _, d := range dirs {
		if p := packNames(t, d); p != first {
			t.Fatalf("packs differ: %s vs %s", p, first)
		}
		s.env.Fsck(d)
	}

	// Once finished, the same clone is a cache hit.
	seq := s.lastSeq(t)
	s.env.Git("", "-c", "protocol.version=2", "clone", "-q", s.gitURL("big"), filepath.Join(t.TempDir(), "again"))
	if got := s.cloneOutcomes(t, seq, 1); got["hit/ok"] != 1 {
		t.Fatalf("repeat clone: %v", got)
	}
	// The kept pack shows in the metrics.
	resp, err := http.Get("http://" + s.HTTPAddr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^packwire_pack_cache_bytes [1-9]`).Match(metrics) || !strings.Contains(string(metrics), "packwire_pack_cache_runs 0") {
		t.Fatalf("pack cache gauges missing or zero")
	}

	// A new commit changes what clones want: a new key, a new generation.
	pushCommit(t, s, "big", "changed")
	seq = s.lastSeq(t)
	s.env.Git("", "-c", "protocol.version=2", "clone", "-q", s.gitURL("big"), filepath.Join(t.TempDir(), "new"))
	if got := s.cloneOutcomes(t, seq, 1); got["generated/ok"] != 1 {
		t.Fatalf("clone after a push: %v", got)
	}
}

// TestPackSharingKilledReader: one of several concurrent clones is killed
// mid-pack; the others finish with good clones and the kill is recorded.
func TestPackSharingKilledReader(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.PackCache, c.PackCacheMaxBytes, c.FetchCache = true, 0, false }) // share, keep nothing
	s.bigRepo(t, "big")
	seq := s.lastSeq(t)

	var cmds []*exec.Cmd
	var dirs []string
	for i := 0; i < 3; i++ {
		dir := filepath.Join(t.TempDir(), "c")
		cmd := exec.Command("git", "-c", "protocol.version=2", "clone", "--progress", s.gitURL("big"), dir)
		cmd.Env = s.env.Vars
		cmds, dirs = append(cmds, cmd), append(dirs, dir)
	}
	stderr, _ := cmds[0].StderrPipe()
	for _, c := range cmds {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	waitProgress(stderr, "Receiving objects:")
	cmds[0].Process.Kill()
	cmds[0].Wait()
	for i, c := range cmds[1:] {
		if err := c.Wait(); err != nil {
			t.Fatalf("clone %d broke when another reader left: %v", i+1, err)
		}
		s.env.Fsck(dirs[i+1])
	}
	// Whether the survivors joined the killed clone's run depends on timing
	// (a 40 MiB pack is made in under a second); the unit test
	// TestSharedRunSurvivesAReaderLeaving proves that case deterministically.
	got := s.cloneOutcomes(t, seq, 3)
	if got["generated/client-gone"]+got["joined/client-gone"] != 1 {
		t.Fatalf("outcomes: %v", got)
	}
}

// TestPackCacheFallback: when the disk is (nearly) full or the cache's
// socket is gone, clones still work, by running pack-objects directly.
func TestPackCacheFallback(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.PackCache, c.PackCacheMinFreeBytes, c.FetchCache = true, 1<<62, false }) // no disk has that much free
	s.seed(t, "team/app")
	seq := s.lastSeq(t)
	dir := filepath.Join(t.TempDir(), "c")
	s.env.Git("", "clone", "-q", s.gitURL("team/app"), dir)
	s.env.Fsck(dir)
	if got := s.cloneOutcomes(t, seq, 1); got["direct/ok"] != 1 {
		t.Fatalf("disk full: %v", got)
	}

	// The cache's socket goes away: the hook runs pack-objects itself.
	s.hooks.Close()
	<-s.hooksDone
	os.Remove(s.Pipeline.HookSocket)
	seq = s.lastSeq(t)
	dir = filepath.Join(t.TempDir(), "c2")
	s.env.Git("", "clone", "-q", s.httpURL("team/app"), dir)
	s.env.Fsck(dir)
	if got := s.cloneOutcomes(t, seq, 1); got["/ok"] != 1 {
		t.Fatalf("no socket: %v", got)
	}
	s.hooks = nil
}

// packObjectsCPU is the CPU of the pack-objects run a full clone of repo
// makes, run here by hand: all branches and tags, to a discarded pack.
func packObjectsCPU(t *testing.T, s *testServer, repo string) time.Duration {
	t.Helper()
	dir := filepath.Join(s.Data.Repos.Dir, repo+".git")
	refs := s.env.Git(dir, "for-each-ref", "--format=%(objectname)", "refs/heads", "refs/tags")
	cmd := exec.Command("git", "pack-objects", "--revs", "--stdout", "--thin", "--delta-base-offset", "-q")
	cmd.Dir, cmd.Env, cmd.Stdin, cmd.Stdout = dir, append(s.env.Vars, "GIT_DIR="+dir), strings.NewReader(refs), io.Discard
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}
