package server

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/maintain"
)

// addPullRefs gives bare n refs/pull/N/head refs on side commits (made by
// fast-import, each with a file of its own) outside branches and tags.
func (s *testServer) addPullRefs(t *testing.T, bare string, n int) {
	t.Helper()
	base := strings.Fields(s.env.Git(bare, "rev-list", "main"))
	var in bytes.Buffer
	for i := 1; i <= n; i++ {
		body := fmt.Sprintf("pull request %d\n", i)
		fmt.Fprintf(&in, "commit refs/pull/%d/head\ncommitter T <t@example.com> 1767225600 +0000\ndata 2\npr\nfrom %s\nM 100644 inline pr%d.txt\ndata %d\n%s\n",
			i, base[i%len(base)], i, len(body), body)
	}
	cmd := exec.Command("git", "fast-import", "--quiet")
	cmd.Dir, cmd.Env, cmd.Stdin = bare, s.env.Vars, &in
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fast-import: %v\n%s", err, out)
	}
}

func countPacks(t *testing.T, bare string) int {
	m, _ := filepath.Glob(filepath.Join(bare, "objects", "pack", "pack-*.pack"))
	return len(m)
}

// TestMaintenanceWhilePushingAndCloning runs full and geometric maintenance
// over and over while a client pushes and another clones over HTTP: every
// push must land, every clone must be fsck-clean, and nothing may be lost.
func TestMaintenanceWhilePushingAndCloning(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MaintainInterval = 0 })
	bare := s.seed(t, "team/app")
	s.addPullRefs(t, bare, 200)
	env := s.env
	r, err := s.Data.Repos.Resolve("team/app")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var pushed []string
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", s.pushURL("team/app"), w)
	wg.Add(2)
	go func() { // pusher
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			f := fmt.Sprintf("push%d.txt", i)
			os.WriteFile(filepath.Join(w, f), []byte(strings.Repeat(f, 50)), 0o644)
			if out, err := env.Run(w, nil, "add", f); err != nil {
				t.Errorf("add: %v %s", err, out)
				return
			}
			if out, err := env.Run(w, nil, "commit", "-qm", f); err != nil {
				t.Errorf("commit: %v %s", err, out)
				return
			}
			if out, err := env.Run(w, nil, "push", "-q", "origin", "main", fmt.Sprintf("HEAD:refs/heads/topic%d", i%3)); err != nil {
				t.Errorf("push %d during maintenance: %v\n%s", i, err, out)
				return
			}
			out, _ := env.Run(w, nil, "rev-parse", "HEAD")
			mu.Lock()
			pushed = append(pushed, strings.TrimSpace(out))
			mu.Unlock()
		}
	}()
	go func() { // cloner
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			c := filepath.Join(t.TempDir(), fmt.Sprintf("c%d", i))
			if out, err := env.Run("", nil, "clone", "-q", s.httpURL("team/app"), c); err != nil {
				t.Errorf("clone %d during maintenance: %v\n%s", i, err, out)
				return
			}
			if out, err := env.Run(c, nil, "fsck", "--full", "--strict", "--no-dangling"); err != nil {
				t.Errorf("fsck of clone %d: %v\n%s", i, err, out)
				return
			}
			if out, err := env.Run(c, nil, "fetch", "-q", "origin", "refs/pull/7/head"); err != nil {
				t.Errorf("fetch refs/pull/7/head: %v\n%s", err, out)
				return
			}
		}
	}()
	runs := 0
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline) || runs < 4; runs++ {
		kind := maintain.Full
		if runs%2 == 1 {
			kind = maintain.Geometric
		}
		if _, err := s.Maintainer.Run(ctx, r, kind, "test"); err != nil {
			t.Errorf("%s run %d: %v", kind, runs, err)
		}
	}
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	if len(pushed) < 3 {
		t.Fatalf("only %d pushes during %d maintenance runs", len(pushed), runs)
	}
	env.Fsck(bare)
	for _, c := range pushed {
		env.Git(bare, "cat-file", "-e", c+"^{commit}")
	}
	if got := env.RevParse(bare, "main"); got != pushed[len(pushed)-1] {
		t.Fatalf("server main %s, last push %s", got, pushed[len(pushed)-1])
	}
	// Back in shape after one more check, and the recorded runs are there.
	if _, err := s.Maintainer.Maintain(ctx, r, false); err != nil {
		t.Fatal(err)
	}
	if kind, reason, err := s.Maintainer.Plan(ctx, r.Path); err != nil || kind != maintain.None {
		t.Fatalf("plan after the pushes settled: %q %q %v", kind, reason, err)
	}
	recs, err := s.Governor.LastMaintenance(ctx, "team/app", 100)
	if err != nil || len(recs) < runs {
		t.Fatalf("%d maintenance records for %d runs (%v)", len(recs), runs, err)
	}
	t.Logf("%d maintenance runs, %d pushes", runs, len(pushed))
}

// TestSchedulerMaintainsInBackground: serve's scheduler brings a repository
// into shape on its own, records the run, and then leaves it alone.
func TestSchedulerMaintainsInBackground(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MaintainInterval = 100 * time.Millisecond })
	bare := s.seed(t, "team/app")
	ctx := context.Background()
	// A safety net: 15 s ran out beside the parallel tests at a load
	// average of 65 on 2 cores.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		recs, err := s.Governor.LastMaintenance(ctx, "team/app", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) > 0 {
			if recs[0].Result != "ok" || recs[0].Kind != "full" {
				t.Fatalf("run %+v", recs[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no maintenance run recorded; log:\n%s", s.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	l, err := maintain.Inspect(bare)
	if err != nil || l.PreferredPack() == nil || !l.Bitmap {
		t.Fatalf("layout after the scheduler: %+v %v", l, err)
	}
	if !strings.Contains(s.logs.String(), "msg=maintenance") {
		t.Fatalf("the run was not logged:\n%s", s.logs)
	}
	// A push lands as a pack; the scheduler folds it into the layout.
	pushCommit(t, s, "team/app", "new.txt")
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		kind, reason, err := s.Maintainer.Plan(ctx, bare)
		if err == nil && kind == maintain.None {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("scheduler left work: %q %q %v", kind, reason, err)
		}
	}
	env := s.env
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", s.httpURL("team/app"), w)
	env.Fsck(w)
	env.Fsck(bare)
}

// TestNoAutoGCInRequestPath: even a repository whose own config asks for
// automatic gc after every push never gets one from packwire's receive-pack.
func TestNoAutoGCInRequestPath(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MaintainInterval = 0 })
	bare := s.seed(t, "team/app")
	s.env.Git(bare, "config", "gc.auto", "1")
	s.env.Git(bare, "config", "gc.autoPackLimit", "1")
	s.env.Git(bare, "config", "receive.autogc", "true")
	s.env.Git(bare, "config", "gc.autoDetach", "false") // an auto gc would finish before the push returns
	before := countPacks(t, bare)
	for i := 0; i < 3; i++ {
		pushCommit(t, s, "team/app", fmt.Sprintf("f%d.txt", i))
	}
	if got := countPacks(t, bare); got != before+3 {
		t.Fatalf("%d packs after 3 pushes (had %d): pushes not kept as packs, or auto gc ran", got, before)
	}
	loose, _ := filepath.Glob(filepath.Join(bare, "objects", "??", "*"))
	if len(loose) != 0 {
		t.Fatalf("%d loose objects after pushes", len(loose))
	}
	// Control: the same repository does auto-gc when git is left to itself.
	s.env.Git(bare, "gc", "--auto", "--quiet")
	if got := countPacks(t, bare); got >= before+3 {
		t.Fatalf("control: git gc --auto did not consolidate (%d packs), so the test proves nothing", got)
	}
}

// TestPackwireRefsHidden: refs/packwire/, reserved for packwire, is never
// listed to clients nor pushable.
func TestPackwireRefsHidden(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MaintainInterval = 0 })
	bare := s.seed(t, "team/app")
	env := s.env
	env.Git(bare, "update-ref", "refs/packwire/tip-tree", env.RevParse(bare, "HEAD^{tree}"))
	for _, url := range []string{s.gitURL("team/app"), s.httpURL("team/app")} {
		for _, proto := range []string{"0", "2"} {
			out := env.Git("", "-c", "protocol.version="+proto, "ls-remote", url)
			if strings.Contains(out, "refs/packwire") || !strings.Contains(out, "refs/heads/main") {
				t.Fatalf("ls-remote v%s %s:\n%s", proto, url, out)
			}
		}
	}
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", s.pushURL("team/app"), w)
	out, err := env.Run(w, nil, "push", "origin", "HEAD:refs/packwire/mine")
	if err == nil || !strings.Contains(out, "hidden ref") {
		t.Fatalf("push to refs/packwire/mine: %v\n%s", err, out)
	}
	if refs := env.Git(bare, "for-each-ref", "refs/packwire/mine"); refs != "" {
		t.Fatalf("the push landed: %s", refs)
	}
	env.Fsck(bare)
}
