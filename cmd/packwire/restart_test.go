//go:build unix

package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/handover"
)

// TestRestartDropsNothing runs the real binary under 16 clone loops (git://,
// HTTP, SSH) and 2 pushers (HTTP, SSH; each push a new branch), and
// restarts it twice while they run: packwire upgrade (SIGUSR2, the same
// binary) and kill -HUP after the binary was replaced by a rebuilt one
// (another version string). No client operation may fail, and every
// acknowledged push must be in the repository afterwards, which git fsck
// finds whole. PACKWIRE_RESTART_LONG=N runs N restarts instead of 2.
func TestRestartDropsNothing(t *testing.T) {
	env := gittest.New(t)
	work := t.TempDir()
	data := filepath.Join(work, "data")
	exe := filepath.Join(work, "bin", "packwire")
	os.MkdirAll(filepath.Dir(exe), 0o755)
	copyFile(t, binary, exe)
	// The upgrade's binary, built while the data directory is made: the
	// same source with another version string, so another file.
	rebuilt := filepath.Join(work, "packwire-rebuilt")
	build := exec.Command("go", "build", "-ldflags=-X=packwire/internal/buildinfo.version=rebuilt", "-o", rebuilt, ".")
	var buildOut strings.Builder
	build.Stdout, build.Stderr = &buildOut, &buildOut
	if err := build.Start(); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{
		{"init", "--data", data},
		{"repo", "create", "r", "--data", data},
	} {
		if out, code := packwire(t, args...); code != 0 {
			t.Fatalf("%v: %s", args, out)
		}
	}
	env.Build(filepath.Join(data, "repos", "r.git"), gittest.Shape{Commits: 20, Files: 20, BlobBytes: 4 << 10})
	key := env.NewSSHKey("alice")
	if out, code := packwire(t, "user", "add", "alice", "--key", key+".pub", "--data", data); code != 0 {
		t.Fatal(out)
	}
	if out, code := packwire(t, "grant", "alice", "write", "**", "--data", data); code != 0 {
		t.Fatal(out)
	}
	out, code := packwire(t, "token", "create", "alice", "--data", data)
	if code != 0 {
		t.Fatal(out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	token := lines[len(lines)-1]

	// The clients start only once the rebuilt binary is there: sixteen
	// clone loops spinning through a build on two cores slowed it (and the
	// whole suite) for minutes, and proved nothing the restarts do not.
	if err := build.Wait(); err != nil {
		t.Fatalf("rebuilding: %v\n%s", err, buildOut.String())
	}

	logFile, err := os.Create(filepath.Join(work, "serve.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	// Every process of the server writes here (a new one inherits it).
	serve := exec.Command(exe, "serve", "--data", data, "--git", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ssh", "127.0.0.1:0",
		// --grace is what an old process gives its running requests: a
		// clone on a loaded machine (load 20+) can outlast 30 s, and one
		// cut at the grace is the operator's choice, not a drop.
		"--grace", "3m", "--maintain-interval", "0")
	serve.Stdout, serve.Stderr = logFile, logFile
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	go serve.Wait() // reaps the first process; later ones are the first's children
	pids := []int{serve.Process.Pid}
	t.Cleanup(func() {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	addrs := waitListening(t, logFile.Name(), serve.Process.Pid)
	pidFile := handover.PIDFile(data)
	waitPID(t, pidFile, serve.Process.Pid)

	urls := []string{
		"git://" + addrs["git"] + "/r",
		"http://" + addrs["http"] + "/r",
		"ssh://alice@" + addrs["ssh"] + "/r",
	}
	pushURLs := []string{"http://alice:" + token + "@" + addrs["http"] + "/r", "ssh://alice@" + addrs["ssh"] + "/r"}
	vars := append(env.Vars, gittest.SSHCommandEnv(key))
	git := func(dir string, args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = dir, vars
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	var (
		stop     atomic.Bool
		ops      atomic.Int64
		mu       sync.Mutex
		failures []string
		acked    = map[string]string{} // branch: commit pushed and acknowledged
		wg       sync.WaitGroup
	)
	fail := func(what, out string, err error) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf("%s: %v\n%s", what, err, out))
	}
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				dir := filepath.Join(work, fmt.Sprintf("clone-%d-%d", i, n))
				url := urls[i%len(urls)]
				if out, err := git("", "clone", "-q", "--no-checkout", url, dir); err != nil {
					fail("clone "+url, out, err)
				}
				os.RemoveAll(dir)
				ops.Add(1)
			}
		}()
	}
	for j, url := range pushURLs {
		dir := filepath.Join(work, fmt.Sprintf("pusher-%d", j))
		if out, err := git("", "clone", "-q", urls[0], dir); err != nil {
			t.Fatalf("pusher's clone: %v\n%s", err, out)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				branch := fmt.Sprintf("p%d-%d", j, n)
				if out, err := git(dir, "commit", "-q", "--allow-empty", "-m", branch); err != nil {
					fail("commit", out, err)
					return
				}
				sha, _ := git(dir, "rev-parse", "HEAD")
				if out, err := git(dir, "push", "-q", url, "HEAD:refs/heads/"+branch); err != nil {
					fail("push "+branch+" over "+strings.SplitN(url, ":", 2)[0], out, err)
				} else {
					mu.Lock()
					acked[branch] = strings.TrimSpace(sha)
					mu.Unlock()
				}
				ops.Add(1)
			}
		}()
	}
	// Each restart happens once every loop has had time for an operation
	// since the last one: requests are in flight when it comes.
	waitOps := func(n int64) {
		target := ops.Load() + n
		deadline := time.Now().Add(2 * time.Minute)
		for ops.Load() < target {
			if time.Now().After(deadline) {
				t.Fatalf("the clients made no progress: %d operations, want %d", ops.Load(), target)
			}
			time.Sleep(20 * time.Millisecond) // a poll of a counter, not a synchronisation
		}
	}
	restarts := 2
	if n, err := fmt.Sscan(os.Getenv("PACKWIRE_RESTART_LONG"), &restarts); n == 0 || err != nil {
		restarts = 2
	}
	waitOps(18)
	for r := range restarts {
		old := pids[len(pids)-1]
		start := time.Now()
		if r%2 == 0 {
			// packwire upgrade: the same binary, a new process.
			if out, code := packwire(t, "upgrade", "--data", data); code != 0 || !strings.Contains(out, "upgraded: pid") {
				t.Fatalf("packwire upgrade: %d %s", code, out)
			}
		} else {
			// A rebuilt binary in place, then kill -HUP.
			next := exe + ".new"
			copyFile(t, rebuilt, next)
			if err := os.Rename(next, exe); err != nil {
				t.Fatal(err)
			}
			syscall.Kill(old, syscall.SIGHUP)
		}
		pid := waitNewPID(t, pidFile, old)
		pids = append(pids, pid)
		waitGone(t, old)
		t.Logf("restart %d: pid %d -> %d in %s, %d operations so far", r+1, old, pid, time.Since(start).Round(time.Millisecond), ops.Load())
		waitOps(18)
	}
	stop.Store(true)
	wg.Wait()

	last := pids[len(pids)-1]
	syscall.Kill(last, syscall.SIGTERM)
	waitGone(t, last)
	if len(failures) > 0 {
		log, _ := os.ReadFile(logFile.Name())
		var notable []string
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.HasPrefix(line, "packwire") {
				notable = append(notable, line)
			}
		}
		if len(notable) > 40 {
			notable = notable[len(notable)-40:]
		}
		t.Errorf("%d failed client operations of %d; the first:\n%s\nthe servers' warnings:\n%s", len(failures), ops.Load(), failures[0], strings.Join(notable, "\n"))
	}
	repoDir := filepath.Join(data, "repos", "r.git")
	for branch, sha := range acked {
		if got, err := git(repoDir, "rev-parse", "refs/heads/"+branch); err != nil || strings.TrimSpace(got) != sha {
			t.Errorf("acknowledged push of %s (%s) lost: %q %v", branch, sha, got, err)
		}
	}
	if out, err := git(repoDir, "fsck", "--no-dangling"); err != nil {
		t.Errorf("git fsck: %v\n%s", err, out)
	}
	log, _ := os.ReadFile(logFile.Name())
	if restarts >= 2 && !strings.Contains(string(log), "packwire rebuilt (") {
		t.Errorf("the rebuilt binary never served:\n%s", log)
	}
	t.Logf("%d operations (%d acknowledged pushes), %d restarts, %d failed", ops.Load(), len(acked), restarts, len(failures))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// waitListening reads the addresses pid printed to the log file.
func waitListening(t *testing.T, log string, pid int) map[string]string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		addrs := map[string]string{}
		f, _ := os.Open(log)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 4 && fields[1] == "listening" {
				addrs[strings.TrimSuffix(fields[0], "://")] = strings.TrimSuffix(fields[3], ",")
			}
		}
		f.Close()
		if len(addrs) == 3 {
			return addrs
		}
		if !handover.Alive(pid) {
			b, _ := os.ReadFile(log)
			t.Fatalf("serve exited:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("serve did not print its addresses")
	return nil
}

func waitPID(t *testing.T, pidFile string, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if pid, err := handover.ReadPID(pidFile); err == nil && pid == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s never named pid %d", pidFile, want)
}

// waitNewPID waits for the pid file to name a process other than old.
func waitNewPID(t *testing.T, pidFile string, old int) int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if pid, err := handover.ReadPID(pidFile); err == nil && pid != old {
			return pid
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no new process replaced pid %d", old)
	return 0
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for handover.Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not exit", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
