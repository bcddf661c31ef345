package maintain

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/pktline"
	"packwire/internal/procgroup"
	"packwire/internal/repo"
)

// pushInProgress is a git receive-pack fed by hand: commands, then a pack
// in as many parts as the test wants.
type pushInProgress struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    bytes.Buffer
	outMu  sync.Mutex
	exited chan struct{} // closed once reaped; err is then set
	err    error
	bare   string
	before map[string]bool // quarantines that existed before it started
}

// startPush starts receive-pack on bare (as packwire serves it: every push
// as a pack) and sends the command creating ref at newID.
func startPush(t *testing.T, env *gittest.Env, bare, ref, newID string) *pushInProgress {
	t.Helper()
	qs, _ := Quarantines(bare)
	p := &pushInProgress{bare: bare, exited: make(chan struct{}), before: map[string]bool{}}
	for _, q := range qs {
		p.before[q.Path] = true
	}
	p.cmd = exec.Command("git", "-c", "receive.unpackLimit=1", "receive-pack", bare)
	p.cmd.Env = env.Vars
	stdin, err := p.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stdin = stdin
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := procgroup.Start(p.cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		procgroup.Kill(p.cmd)
		<-p.exited
	})
	go func() {
		b := make([]byte, 32<<10)
		for {
			n, err := stdout.Read(b)
			p.outMu.Lock()
			p.out.Write(b[:n])
			p.outMu.Unlock()
			if err != nil {
				break
			}
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	zero := strings.Repeat("0", 40)
	var cmds []byte
	cmds, _ = pktline.Append(cmds, []byte(zero+" "+newID+" "+ref+"\x00report-status\n"))
	cmds = append(cmds, "0000"...)
	if _, err := stdin.Write(cmds); err != nil {
		t.Fatal(err)
	}
	return p
}

// quarantine waits until the push's quarantine exists and holds at least
// min bytes, and returns it.
func (p *pushInProgress) quarantine(t *testing.T, min int64) Quarantine {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		qs, _ := Quarantines(p.bare)
		for _, q := range qs {
			if !p.before[q.Path] && q.Bytes >= min {
				return q
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no quarantine with %d bytes in %s after 30s: %+v", min, p.bare, qs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *pushInProgress) output() string {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	return p.out.String()
}

// ageTree sets the times of everything under dir to at.
func ageTree(t *testing.T, dir string, at time.Time) {
	t.Helper()
	var paths []string
	filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err == nil {
			paths = append(paths, path)
		}
		return nil
	})
	for i := len(paths) - 1; i >= 0; i-- { // children first, the directory last
		if err := os.Chtimes(paths[i], at, at); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStaleQuarantinesRemoved: a push killed with SIGKILL mid-pack leaves
// its quarantine (objects/tmp_objdir-incoming-*) behind for good. Once
// nothing was written in it for the quarantine age, a maintenance pass
// removes it and logs it with its size; a push in progress keeps its own
// and completes; the repository stays fsck-clean.
func TestStaleQuarantinesRemoved(t *testing.T) {
	t.Parallel()
	env := gittest.New(t)
	src := filepath.Join(t.TempDir(), "src.git")
	env.Build(src, gittest.Shape{Commits: 2, Files: 8, BlobBytes: 512 << 10, Incompress: true, Seed: 3})
	tip := env.RevParse(src, "main")
	cmd := exec.Command("git", "pack-objects", "--stdout", "--revs", "-q")
	cmd.Dir, cmd.Env, cmd.Stdin = src, env.Vars, strings.NewReader(tip+"\n")
	pack, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	half := len(pack) / 2

	bare := filepath.Join(t.TempDir(), "app.git")
	env.Build(bare, gittest.Shape{Commits: 5, Files: 5, BlobBytes: 1000, Seed: 1})
	r := repo.Repo{Name: "app", Path: bare}

	// A push killed mid-pack, as kill -9 of the server (or packwire's own
	// kill of a push whose client went away) leaves it.
	killed := startPush(t, env, bare, "refs/heads/killed", tip)
	killed.stdin.Write(pack[:half])
	killed.quarantine(t, int64(half)/2)
	procgroup.Kill(killed.cmd)
	<-killed.exited
	stale := killed.quarantine(t, 0) // as the kill left it: index-pack wrote on until then
	if !strings.HasPrefix(filepath.Base(stale.Path), "tmp_objdir-incoming-") {
		t.Fatalf("git 2.35+ names a push quarantine tmp_objdir-incoming-*, got %s", stale.Name)
	}
	if _, err := os.Stat(stale.Path); err != nil {
		t.Fatalf("the killed push's quarantine is gone by itself: %v", err)
	}
	ageTree(t, stale.Path, time.Now().Add(-2*DefaultQuarantineAge))

	// A push in progress, half its pack sent.
	live := startPush(t, env, bare, "refs/heads/live", tip)
	live.stdin.Write(pack[:half])
	fresh := live.quarantine(t, int64(half)/2)

	var logs bytes.Buffer
	var logMu sync.Mutex
	m := New(Options{Log: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))})
	sched := &Scheduler{M: m, Repos: func() ([]repo.Repo, error) { return []repo.Repo{r}, nil }}
	sched.Pass(context.Background())

	if _, err := os.Stat(stale.Path); err == nil {
		t.Fatalf("the stale quarantine %s (%d bytes, last written %v ago) is still there after a maintenance pass", stale.Name, stale.Bytes, 2*DefaultQuarantineAge)
	}
	logMu.Lock()
	logged := logs.String()
	logMu.Unlock()
	if !strings.Contains(logged, "removed a stale push quarantine") || !strings.Contains(logged, filepath.Base(stale.Path)) ||
		!strings.Contains(logged, fmt.Sprintf("bytes=%d", stale.Bytes)) {
		t.Fatalf("removal not logged with its size (%d bytes):\n%s", stale.Bytes, logged)
	}
	if _, err := os.Stat(fresh.Path); err != nil {
		t.Fatalf("the live push's quarantine was removed: %v", err)
	}

	// The live push finishes as if nothing happened.
	live.stdin.Write(pack[half:])
	live.stdin.Close()
	select {
	case <-live.exited:
		if live.err != nil || !strings.Contains(live.output(), "ok refs/heads/live") {
			t.Fatalf("live push: %v\n%q", live.err, live.output())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("live push did not finish")
	}
	if got := env.RevParse(bare, "refs/heads/live"); got != tip {
		t.Fatalf("refs/heads/live is %s, pushed %s", got, tip)
	}
	if qs, _ := Quarantines(bare); len(qs) != 0 {
		t.Fatalf("quarantines left: %+v", qs)
	}
	env.Fsck(bare)
	// A second pass has nothing to remove.
	if removed := m.RemoveStaleQuarantines(r); len(removed) != 0 {
		t.Fatalf("removed %+v on a clean repository", removed)
	}
}

func TestQuarantineAge(t *testing.T) {
	for _, c := range []struct{ idle, want time.Duration }{
		{0, time.Hour}, {10 * time.Minute, time.Hour}, {45 * time.Minute, 90 * time.Minute},
	} {
		if got := QuarantineAge(c.idle); got != c.want {
			t.Errorf("QuarantineAge(%v) = %v, want %v", c.idle, got, c.want)
		}
	}
	for name, want := range map[string]bool{"tmp_objdir-incoming-a1B2c3": true, "tmp_objdir-bulk-fsync-x": true,
		"incoming-Xy12ab": true, "pack": false, "info": false, "0a": false, "tmp_obj_abc": false} {
		if isQuarantine(name) != want {
			t.Errorf("isQuarantine(%q) = %v", name, !want)
		}
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestQuarantineSweepIgnoresBudget: with the hour's CPU budget used up a
// pass runs no maintenance, but still removes stale quarantines.
func TestQuarantineSweepIgnoresBudget(t *testing.T) {
	env := gittest.New(t)
	bare := filepath.Join(t.TempDir(), "app.git")
	env.Build(bare, gittest.Shape{Commits: 3, Seed: 1})
	stale := filepath.Join(bare, "objects", "tmp_objdir-incoming-Zz9Yy8")
	if err := os.MkdirAll(filepath.Join(stale, "pack"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(stale, "pack", "tmp_pack_q"), make([]byte, 100), 0o644)
	ageTree(t, stale, time.Now().Add(-3*time.Hour))
	sched := &Scheduler{M: quietMaintainer(), Budget: time.Minute,
		Repos: func() ([]repo.Repo, error) { return []repo.Repo{{Name: "app", Path: bare}}, nil }}
	sched.used = []spent{{at: time.Now(), cpu: time.Hour}}
	if runs := sched.Pass(context.Background()); runs != 0 {
		t.Fatalf("%d runs with the budget used up", runs)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Fatal("the stale quarantine survived a pass whose budget was used up")
	}
}
