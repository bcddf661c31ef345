package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"packwire/bench/internal/benchkit"
)

const (
	cloneLoops = 8
	pushers    = 2
)

// honestResult is what the honest clients saw in one phase.
type honestResult struct {
	ops         int // clones and pushes completed or failed
	errors      int
	firstError  string
	medianClone time.Duration
	pushes      int // acknowledged
}

func (h honestResult) String() string {
	return fmt.Sprintf("%d ops, %d errors, median clone %s, %d pushes%s", h.ops, h.errors, ms(h.medianClone), h.pushes, firstErr(h))
}

// acked holds every branch an honest push created and the server
// acknowledged; checkPushes looks for each at the end.
var (
	ackedMu sync.Mutex
	acked   = map[string]string{} // branch -> commit
	seq     atomic.Int64
)

// honest runs the clone loops and pushers for d.
func (e *env) honest(ctx context.Context, d time.Duration) honestResult {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var res honestResult
	var walls []time.Duration
	fail := func(what string, err error, out []byte) {
		mu.Lock()
		defer mu.Unlock()
		res.errors++
		if res.firstError == "" {
			msg := strings.TrimSpace(string(out))
			if i := strings.LastIndex(msg, "\n"); i >= 0 {
				msg = msg[i+1:]
			}
			res.firstError = fmt.Sprintf("%s: %v: %s", what, err, msg)
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < cloneLoops; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				url, env := e.url(i+n, false)
				dir := filepath.Join(e.out, "clones", fmt.Sprintf("c%d-%d", i, seq.Add(1)))
				start := time.Now()
				// Not bound to ctx: a clone started in the phase runs to its end.
				out, err := gitCmd(env, "clone", "-q", "--bare", url, dir).CombinedOutput()
				wall := time.Since(start)
				os.RemoveAll(dir)
				mu.Lock()
				res.ops++
				if err == nil {
					walls = append(walls, wall)
				}
				mu.Unlock()
				if err != nil {
					fail("clone "+url, err, out)
				}
			}
		}(i)
	}
	for p := 0; p < pushers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			work := filepath.Join(e.out, "push", fmt.Sprintf("p%d", p))
			url, env := e.url(p, true) // HTTP, then SSH
			if _, err := os.Stat(work); err != nil {
				if out, err := gitCmd(env, "clone", "-q", "--depth", "1", url, work).CombinedOutput(); err != nil {
					fail("pusher clone", err, out)
					return
				}
			}
			for ctx.Err() == nil {
				branch := fmt.Sprintf("honest/p%d-%d", p, seq.Add(1))
				os.WriteFile(filepath.Join(work, "honest.txt"), []byte(branch+"\n"), 0o644)
				gitCmd(env, "-C", work, "add", "honest.txt").Run()
				gitCmd(env, "-C", work, "-c", "user.name=h", "-c", "user.email=h@x", "commit", "-q", "-m", branch).Run()
				commit := strings.TrimSpace(benchkit.Output("git", "-C", work, "rev-parse", "HEAD"))
				out, err := gitCmd(env, "-C", work, "push", "-q", url, "HEAD:refs/heads/"+branch).CombinedOutput()
				mu.Lock()
				res.ops++
				if err == nil {
					res.pushes++
				}
				mu.Unlock()
				if err != nil {
					fail("push", err, out)
					continue
				}
				ackedMu.Lock()
				acked[branch] = commit
				ackedMu.Unlock()
			}
		}(p)
	}
	wg.Wait()
	res.medianClone = benchkit.Median(walls)
	return res
}

// url is the honest clients' i-th transport in turn: git://, HTTP, SSH
// (pushers: HTTP with the token, SSH).
func (e *env) url(i int, push bool) (string, []string) {
	if push {
		if i%2 == 0 {
			return "http://honest:" + e.token + "@127.0.0.1:" + e.http + "/team/app.git", e.clientEnv
		}
		return "ssh://git@127.0.0.1:" + e.ssh + "/team/app.git", e.sshEnv
	}
	switch i % 3 {
	case 0:
		return "git://127.0.0.1:" + e.git + "/team/app.git", e.clientEnv
	case 1:
		return "http://127.0.0.1:" + e.http + "/team/app.git", e.clientEnv
	default:
		return "ssh://git@127.0.0.1:" + e.ssh + "/team/app.git", e.sshEnv
	}
}

func gitCmd(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", append([]string{"-c", "protocol.version=2"}, args...)...)
	cmd.Env = env
	return cmd
}

// checkPushes lists acknowledged pushes whose branch is not on the server
// at its commit.
func (e *env) checkPushes() []string {
	bare := filepath.Join(e.data, "repos", "team", "app.git")
	refs := map[string]string{}
	for _, line := range strings.Split(benchkit.Output("git", "-C", bare, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/honest"), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			refs[strings.TrimPrefix(f[0], "refs/heads/")] = f[1]
		}
	}
	var lost []string
	ackedMu.Lock()
	defer ackedMu.Unlock()
	for branch, commit := range acked {
		if refs[branch] != commit {
			lost = append(lost, branch)
		}
	}
	return lost
}
