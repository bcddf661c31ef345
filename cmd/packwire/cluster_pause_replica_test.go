//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/pgtest"
	"packwire/internal/server/cluster"
)

// TestClusterPausedReplicaLosesNothing (issue 29, items 1 and 4): the
// workload that lost acknowledged pushes. Four pushers create a new
// branch on every push (no later push touches a ref a stale copy
// lacks), through every node, while one replica is paused (SIGSTOP)
// 0.7 s every 3 s, so that it keeps falling behind and catching up;
// then the primary is killed (SIGKILL) and another copy promoted, and
// the killed node comes back. Every acknowledged branch is then on
// every copy at its commit, every copy fsck-clean, cluster verify finds
// them equal, and the paused replica, once no longer paused, catches up
// (recorded at the repository's generation) while the pushes go on.
// PACKWIRE_CHAOS_SECONDS sets the load's length (default 20).
func TestClusterPausedReplicaLosesNothing(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	seconds := 20
	if s, err := strconv.Atoi(os.Getenv("PACKWIRE_CHAOS_SECONDS")); err == nil && s > 0 {
		seconds = s
	}
	url := pgtest.Shared(t).NewDatabase(t)
	base := t.TempDir()
	nodes := map[string]*nodeProc{}
	for _, name := range []string{"a", "b", "c"} {
		nodes[name] = startNode(t, name, filepath.Join(base, name), url)
	}
	admin := storeAdmin(t, url, filepath.Join(t.TempDir(), "none"))
	status := func() cluster.RepoStatus {
		var st cluster.Status
		out, code := packwire(t, "cluster", "status", "--json", "--node-timeout", "1s", "--database", url, "--data", filepath.Join(base, "none"))
		if code == 0 {
			json.Unmarshal([]byte(out), &st)
		}
		for _, r := range st.Repos {
			if r.Name == "app" {
				return r
			}
		}
		return cluster.RepoStatus{}
	}
	logs := func() { // the cluster's own lines, not every request's
		for _, name := range []string{"a", "b", "c"} {
			b, _ := os.ReadFile(filepath.Join(base, name+".log"))
			var own []string
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "msg=\"cluster: ") {
					own = append(own, line)
				}
			}
			t.Logf("node %s's log:\n%s", name, cluster.LastLines(strings.Join(own, "\n"), 30))
		}
	}
	settled := func(within time.Duration) cluster.RepoStatus {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			r := status()
			ok := len(r.Replicas) == 3
			for _, rp := range r.Replicas {
				ok = ok && rp.Generation == r.Generation && rp.Healthy
			}
			if ok {
				return r
			}
			if time.Now().After(deadline) {
				logs()
				t.Fatalf("the cluster did not settle: %+v", r)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	admin("repo", "create", "app")
	admin("user", "add", "ci")
	admin("grant", "ci", "write", "**")
	lines := strings.Split(strings.TrimSpace(admin("token", "create", "ci")), "\n")
	token := lines[len(lines)-1]
	primary := settled(15 * time.Second).Primary
	paused := "a"
	for _, n := range []string{"c", "b", "a"} {
		if n != primary {
			paused = n
		}
	}
	env := gittest.New(t)
	var mu sync.Mutex
	dead := ""
	acked := map[string]string{} // branch -> the commit its push's report said ok for
	pick := func() *nodeProc {
		mu.Lock()
		defer mu.Unlock()
		var names []string
		for _, n := range []string{"a", "b", "c"} {
			if n != dead {
				names = append(names, n)
			}
		}
		return nodes[names[rand.IntN(len(names))]]
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var pushesOK, pushesFailed atomic.Int64
	var reasons sync.Map
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work := filepath.Join(base, fmt.Sprintf("pusher%d", i))
			env.Git("", "init", "-q", "-b", "main", work)
			for n := 0; ctx.Err() == nil; n++ {
				os.WriteFile(filepath.Join(work, "f"), []byte(fmt.Sprintf("%d %d\n", i, n)), 0o644)
				env.Git(work, "add", ".")
				env.Git(work, "commit", "-qm", fmt.Sprintf("pusher %d push %d", i, n))
				head := env.RevParse(work, "HEAD")
				branch := fmt.Sprintf("p%d-%d", i, n)
				node := pick()
				if out, err := env.Run(work, nil, "push", "--porcelain", fmt.Sprintf("http://ci:%s@%s/app", token, node.httpAddr), "HEAD:refs/heads/"+branch); err != nil {
					pushesFailed.Add(1)
					reasons.Store(cluster.LastLines(out, 2), true)
					time.Sleep(50 * time.Millisecond)
					continue
				}
				pushesOK.Add(1)
				mu.Lock()
				acked[branch] = head
				mu.Unlock()
			}
		}()
	}
	// The replica is paused 0.7 s every 3 s; between pauses, it is
	// counted when seen current.
	caughtUp := 0
	loadEnd := time.Now().Add(time.Duration(seconds) * time.Second)
	for time.Now().Before(loadEnd) {
		nodes[paused].cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(700 * time.Millisecond)
		nodes[paused].cmd.Process.Signal(syscall.SIGCONT)
		for next := time.Now().Add(2300 * time.Millisecond); time.Now().Before(next); time.Sleep(100 * time.Millisecond) {
			r := status()
			for _, rp := range r.Replicas {
				if rp.Node == paused && rp.Generation == r.Generation && r.Generation > 0 {
					caughtUp++
				}
			}
		}
	}
	// No more pauses: with the pushes going on, the replica is current
	// within moments (before, "the repository kept moving; will catch up
	// later" for as long as pushes came).
	resumed := time.Now()
	var converged time.Duration
	for converged == 0 && time.Since(resumed) < 20*time.Second {
		r := status()
		for _, rp := range r.Replicas {
			if rp.Node == paused && rp.Generation == r.Generation {
				converged = time.Since(resumed)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if converged == 0 {
		logs()
		t.Errorf("the paused replica %s did not catch up within 20 s of its last pause while pushes went on", paused)
	}
	// The primary is killed under the pushes; another copy is promoted.
	mu.Lock()
	dead = primary
	mu.Unlock()
	nodes[primary].cmd.Process.Signal(syscall.SIGKILL)
	nodes[primary].cmd.Wait()
	killed := time.Now()
	for status().Primary == primary {
		if time.Since(killed) > 15*time.Second {
			logs()
			t.Fatal("no failover within 15 s of the primary's kill")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("failover in %s", time.Since(killed).Round(10*time.Millisecond))
	time.Sleep(2 * time.Second) // pushes to the new primary
	stop()
	wg.Wait()
	t.Logf("pushes: %d acknowledged, %d failed; %s seen current %d times between its pauses, and %s after the last", pushesOK.Load(), pushesFailed.Load(), paused, caughtUp, converged.Round(time.Millisecond))
	reasons.Range(func(k, _ any) bool {
		t.Logf("a push failed with: %s", k)
		return true
	})
	if pushesOK.Load() == 0 {
		t.Fatal("the load did nothing")
	}

	// The killed node comes back and catches up; every acknowledged
	// branch is on every copy.
	victim := nodes[primary]
	nodes[primary] = startNode(t, primary, victim.dir, url)
	settled(30 * time.Second)
	lost := 0
	for _, name := range []string{"a", "b", "c"} {
		bare := filepath.Join(nodes[name].dir, "repos", "app.git")
		env.Git(bare, "fsck", "--strict")
		have := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(env.Git(bare, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/")), "\n") {
			if ref, id, ok := strings.Cut(line, " "); ok {
				have[strings.TrimPrefix(ref, "refs/heads/")] = id
			}
		}
		for branch, commit := range acked {
			if have[branch] != commit {
				lost++
				t.Errorf("node %s: acknowledged %s at %s, have %q", name, branch, commit[:12], have[branch])
			}
		}
	}
	if lost > 0 {
		logs()
	}
	if out := admin("cluster", "verify", "app"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify:\n%s", out)
	}
}
