package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/pgtest"
	"packwire/internal/server"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

// TestClusterTinyPool: three nodes whose store pools hold two PostgreSQL
// connections each (--database-max-conns 2). A node whose pool is full
// (its connections wait for a repository's row lock) keeps heartbeating
// on its own connection: it stays healthy and nothing is failed over. A
// storm of pushes (relayed to each repository's primary, several to one
// repository at once) and clones against every node then completes, with
// every node healthy throughout and every copy equal.
func TestClusterTinyPool(t *testing.T) {
	// Not in parallel: it asserts that no node misses its 1 s heartbeat
	// timeout, which beside the parallel cluster tests at a load average of
	// 65 they did (failed over again and again).
	ctx := context.Background()
	url := pgtest.Shared(t).NewDatabase(t)
	const heartbeat, timeout = 200 * time.Millisecond, time.Second
	names := []string{"a", "b", "c"}
	nodes := startNodes(t, url, names, heartbeat, timeout, func(c *server.Config) {
		c.DatabaseMaxConns = 2
		c.MaxRequestsPerClient = 0 // every client is 127.0.0.1
	})
	admin := storeAdmin(t, url, filepath.Join(t.TempDir(), "none"))
	repos := []string{"s1", "s2"}
	for _, r := range repos {
		admin("repo", "create", r, "--replicas", "3")
	}
	admin("user", "add", "ci")
	admin("grant", "ci", "write", "**")
	lines := strings.Split(strings.TrimSpace(admin("token", "create", "ci")), "\n")
	token := lines[len(lines)-1]
	watch, err := store.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	status := func() cluster.Status {
		t.Helper()
		st, err := cluster.ReadStatus(ctx, watch.DB, timeout)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	// problems lists what is wrong with the cluster now: an unhealthy
	// node, a repository failed over (its epoch moved).
	problems := func(st cluster.Status) []string {
		var out []string
		for _, n := range st.Nodes {
			if !n.Healthy {
				out = append(out, fmt.Sprintf("node %s unhealthy (heartbeat %s old)", n.Name, n.HeartbeatAge))
			}
		}
		for _, r := range st.Repos {
			if r.Epoch != 0 {
				out = append(out, fmt.Sprintf("%s failed over to %s", r.Name, r.Primary))
			}
		}
		return out
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ready := true
		for _, r := range status().Repos {
			for _, rp := range r.Replicas {
				ready = ready && rp.Generation == 0
			}
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("copies not created: %+v", status().Repos)
		}
	}

	// The primary of s1 with its whole pool taken: one connection holds
	// s1's row, the other waits for it (as pushes to s1 would).
	primary := status().Repos[0].Primary
	pool := nodes[primary].Data.Store.DB
	holder, err := pool.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	var name string
	if err := holder.QueryRowContext(ctx, "SELECT name FROM cluster_repos WHERE name = 's1' FOR UPDATE").Scan(&name); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		tx, err := pool.BeginTx(ctx, nil)
		if err == nil {
			err = tx.QueryRowContext(ctx, "SELECT name FROM cluster_repos WHERE name = 's1' FOR UPDATE").Scan(new(string))
			tx.Rollback()
		}
		waited <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); pool.Stats().InUse < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s's pool never filled: %+v", primary, pool.Stats())
		}
	}
	beatOf := func(st cluster.Status) time.Time {
		for _, n := range st.Nodes {
			if n.Name == primary {
				return n.LastHeartbeat
			}
		}
		t.Fatalf("no node %s", primary)
		return time.Time{}
	}
	first := beatOf(status())
	for end := time.Now().Add(4 * timeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		st := status()
		if p := problems(st); len(p) > 0 {
			t.Fatalf("with %s's store pool full (%+v): %s", primary, pool.Stats(), strings.Join(p, "; "))
		}
	}
	if moved := beatOf(status()).Sub(first); moved < 2*timeout {
		t.Fatalf("%s's heartbeat moved %s in %s with its store pool full", primary, moved, 4*timeout)
	}
	holder.Rollback()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}

	// The storm: per repository three pushers (a branch each, each push
	// to the next node), and cloners, at once; the cluster watched.
	env := nodes["a"].Env
	bounded := []string{"GIT_HTTP_LOW_SPEED_LIMIT=1", "GIT_HTTP_LOW_SPEED_TIME=30"}
	repoURL := func(node, repo string) string {
		return fmt.Sprintf("http://ci:%s@%s/%s", token, nodes[node].HTTPAddr, repo)
	}
	stopWatch := make(chan struct{})
	var watchMu sync.Mutex
	var seen []string
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(100 * time.Millisecond):
			}
			st, err := cluster.ReadStatus(ctx, watch.DB, timeout)
			if err != nil {
				continue
			}
			if p := problems(st); len(p) > 0 {
				watchMu.Lock()
				seen = append(seen, p...)
				watchMu.Unlock()
			}
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	const pushers, pushes, cloners, clones = 4, 4, 3, 3
	tips := map[string]string{}
	for _, r := range repos {
		for p := range pushers {
			work := filepath.Join(t.TempDir(), fmt.Sprintf("%s-%d", r, p))
			env.Git("", "init", "-q", "-b", "main", work)
			wg.Add(1)
			go func() {
				defer wg.Done()
				branch := fmt.Sprintf("p%d", p)
				for i := range pushes {
					os.WriteFile(filepath.Join(work, "f"), []byte(fmt.Sprintf("%s %d %d\n", r, p, i)), 0o644)
					if out, err := env.Run(work, nil, "add", "."); err != nil {
						fail("git add: %v %s", err, out)
						return
					}
					if out, err := env.Run(work, nil, "commit", "-qm", fmt.Sprint(i)); err != nil {
						fail("git commit: %v %s", err, out)
						return
					}
					node := names[(p+i)%len(names)]
					var out string
					var err error
					// A push told to push again (its copy being caught up,
					// the server busy) is pushed again, a few times.
					for try := 0; try < 5; try++ {
						if out, err = env.Run(work, bounded, "push", "-q", repoURL(node, r), "HEAD:"+branch); err == nil {
							break
						}
						time.Sleep(200 * time.Millisecond)
					}
					if err != nil {
						fail("push %d of %s/%s to %s: %v\n%s", i, r, branch, node, err, lastLines(out))
						return
					}
				}
				out, _ := env.Run(work, nil, "rev-parse", "HEAD")
				mu.Lock()
				tips[r+" "+branch] = strings.TrimSpace(out)
				mu.Unlock()
			}()
		}
		for c := range cloners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range clones {
					node := names[(c+i)%len(names)]
					dir := filepath.Join(t.TempDir(), "clone")
					// Over git://: one session, served by one copy. A
					// stateless HTTP clone's requests may reach different
					// copies, and one that took a push not yet committed may
					// advertise a tip another lacks ("not our ref": see the
					// README's cluster guarantees), which is not this test's.
					if out, err := env.Run("", bounded, "clone", "-q", "git://"+nodes[node].GitAddr.String()+"/"+r, dir); err != nil {
						fail("clone %s from %s: %v\n%s", r, node, err, lastLines(out))
					}
				}
			}()
		}
	}
	stormDone := make(chan struct{})
	began := time.Now()
	go func() { wg.Wait(); close(stormDone) }()
	select {
	case <-stormDone:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the storm did not end in 3 minutes: pools %+v %+v %+v",
			nodes["a"].Data.Store.DB.Stats(), nodes["b"].Data.Store.DB.Stats(), nodes["c"].Data.Store.DB.Stats())
	}
	close(stopWatch)
	<-watched
	t.Logf("storm of %d pushes and %d clones in %s", len(repos)*pushers*pushes, len(repos)*cloners*clones, time.Since(began).Round(time.Millisecond))
	for _, f := range failures {
		t.Error(f)
	}
	if len(seen) > 0 {
		t.Errorf("during the storm: %s", strings.Join(seen, "; "))
	}
	for _, r := range repos {
		if out := admin("cluster", "verify", r, "--wait", "20s"); strings.Count(out, " equal") != 3 {
			t.Errorf("cluster verify %s:\n%s", r, out)
		}
		for _, n := range names {
			for p := range pushers {
				branch := fmt.Sprintf("p%d", p)
				bare := filepath.Join(nodes[n].Data.Dir, "repos", r+".git")
				got, _ := env.Run(bare, nil, "rev-parse", "refs/heads/"+branch)
				if want := tips[r+" "+branch]; strings.TrimSpace(got) != want {
					t.Errorf("%s's %s on %s at %s, want %s", r, branch, n, strings.TrimSpace(got), want)
				}
			}
		}
	}
}
