package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/pgtest"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

// TestClusterMoveCopies: four nodes, a repository on three of them, pushes
// going on throughout. `cluster move` from a healthy node makes the new
// copy, then drops the old one, the primary's included (the primary
// handed over); `cluster evacuate` of a node that is down moves its copy
// at once and forgets the node. Every push acknowledged is on every copy
// afterwards, the copies are equal and fsck-clean, and a clone from a new
// copy checks out the repository's HEAD.
func TestClusterMoveCopies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.Shared(t).NewDatabase(t)
	const heartbeat, timeout = 200 * time.Millisecond, time.Second
	names := []string{"a", "b", "c", "d"}
	nodes := startNodes(t, url, names, heartbeat, timeout, nil)
	env := nodes["a"].Env
	nowhere := filepath.Join(t.TempDir(), "none")
	admin := storeAdmin(t, url, nowhere)
	token := aliceWrites(admin)
	admin("repo", "create", "team/m", "--replicas", "3", "--default-branch", "trunk")
	watch, err := store.OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	placement := func() cluster.Placement {
		t.Helper()
		p, err := cluster.Locate(ctx, watch.DB, "team/m", timeout)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	holders := func(p cluster.Placement) []string {
		var out []string
		for _, r := range p.Replicas {
			out = append(out, r.Node)
		}
		slices.Sort(out)
		return out
	}
	spare := func(p cluster.Placement) string {
		for _, n := range names {
			if !p.Has(n) && nodes[n] != nil {
				return n
			}
		}
		t.Fatalf("no node without a copy: %+v", p)
		return ""
	}

	// Pushes through the nodes that stay up, one commit after another, on
	// trunk, each acknowledged one remembered.
	work := filepath.Join(t.TempDir(), "work")
	env.Git("", "init", "-q", "-b", "trunk", work)
	var mu sync.Mutex
	var acked string
	var failures []string
	push := func(i int, via string) {
		os.WriteFile(filepath.Join(work, "f"), []byte(fmt.Sprintf("%d\n", i)), 0o644)
		env.Git(work, "add", ".")
		env.Git(work, "commit", "-qm", fmt.Sprint(i))
		target := fmt.Sprintf("http://alice:%s@%s/team/m", token, nodes[via].HTTPAddr)
		var out string
		var err error
		// Told to push again (a primary handed over, a copy catching
		// up): pushed again, a few times, as a client would.
		for try := 0; try < 10; try++ {
			if out, err = env.Run(work, nil, "push", "-q", target, "trunk"); err == nil {
				mu.Lock()
				acked = strings.TrimSpace(env.Git(work, "rev-parse", "HEAD"))
				mu.Unlock()
				return
			}
			time.Sleep(300 * time.Millisecond)
		}
		mu.Lock()
		failures = append(failures, fmt.Sprintf("push %d via %s: %v\n%s", i, via, err, lastLines(out)))
		mu.Unlock()
	}
	waitMade := func() {
		t.Helper()
		if _, err := cluster.AwaitCopies(ctx, watch.DB, "team/m", 20*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	waitMade()
	push(0, "a")

	stop := make(chan struct{})
	// up holds the nodes pushes may go through. A push holds turn from
	// choosing its node to its end, so once a node is taken out of up under
	// turn, no push goes through it (a sleep instead lost that race under
	// load: a push chosen before, through the node then shut down).
	var turn sync.Mutex
	up := map[string]bool{}
	for _, n := range names {
		up[n] = true
	}
	pushed := make(chan int)
	go func() {
		i := 1
		defer func() { pushed <- i }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(150 * time.Millisecond):
			}
			turn.Lock()
			for _, n := range names {
				if up[n] && i%len(names) == slices.Index(names, n) {
					push(i, n)
				}
			}
			turn.Unlock()
			i++
		}
	}()

	// 1. From a healthy node that is not the primary, then the primary's
	// own copy.
	p := placement()
	var from string
	for _, r := range p.Replicas {
		if r.Node != p.Primary {
			from = r.Node
		}
	}
	to := spare(p)
	if out := admin("cluster", "move", "team/m", from, to); !strings.Contains(out, "team/m: moved from "+from+" to "+to) {
		t.Fatalf("cluster move:\n%s", out)
	}
	p = placement()
	if p.Has(from) || !p.UpToDate(to) {
		t.Fatalf("after moving %s -> %s: %+v", from, to, p)
	}
	oldPrimary, oldEpoch := p.Primary, p.Epoch
	if out := admin("cluster", "move", "team/m", oldPrimary, from); !strings.Contains(out, "moved from "+oldPrimary) {
		t.Fatalf("cluster move of the primary's copy:\n%s", out)
	}
	p = placement()
	if p.Has(oldPrimary) || p.Primary == oldPrimary || p.Epoch != oldEpoch+1 {
		t.Fatalf("after moving the primary's copy away from %s: %+v", oldPrimary, p)
	}
	// The old copy's files go into its node's trash; from, which holds a
	// copy again, kept and caught up the files it had.
	oldFiles := filepath.Join(nodes[oldPrimary].Data.Dir, "repos", "team", "m.git")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(oldFiles); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's dropped copy still at %s", oldPrimary, oldFiles)
		}
	}
	if trash, _ := filepath.Glob(filepath.Join(nodes[oldPrimary].Data.Dir, "repos", ".trash", "team", "*")); len(trash) == 0 {
		t.Fatalf("%s's dropped copy is not in its trash", oldPrimary)
	}

	// 2. A node that is down: its copy is replaced at once.
	var down string
	for _, r := range p.Replicas {
		if r.Node != p.Primary {
			down = r.Node
		}
	}
	turn.Lock()
	delete(up, down)
	turn.Unlock()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	nodes[down].Shutdown(sctx)
	cancel()
	nodes[down] = nil
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if ok, _ := cluster.Healthy(ctx, watch.DB, down, timeout); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still healthy 10 s after its shutdown", down)
		}
	}
	out := admin("cluster", "evacuate", down, "--node-timeout", timeout.String())
	if !strings.Contains(out, "copy on "+down+" (down) dropped") || !strings.Contains(out, "removed from the cluster's nodes") {
		t.Fatalf("cluster evacuate %s:\n%s", down, out)
	}
	close(stop)
	n := <-pushed
	p = placement()
	if p.Has(down) || len(p.Replicas) != 3 {
		t.Fatalf("after evacuating %s: %+v", down, p)
	}
	for _, f := range failures {
		t.Error(f)
	}
	t.Logf("%d pushes while copies moved; copies now on %v, primary %s", n, holders(p), p.Primary)

	// Every copy equal, with the last acknowledged push, fsck-clean; a
	// clone from each node checks out trunk at it.
	if out := admin("cluster", "verify", "team/m", "--wait", "30s"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify:\n%s", out)
	}
	for _, node := range holders(p) {
		bare := filepath.Join(nodes[node].Data.Dir, "repos", "team", "m.git")
		if got := env.RevParse(bare, "refs/heads/trunk"); got != acked {
			t.Errorf("%s's trunk at %s, want the last acknowledged push %s", node, got, acked)
		}
		if out, err := env.Run(bare, nil, "fsck", "--no-progress"); err != nil {
			t.Errorf("git fsck on %s: %v\n%s", node, err, out)
		}
		clone := filepath.Join(t.TempDir(), "clone-"+node)
		env.Git("", "clone", "-q", nodes[node].GitURL("team/m"), clone)
		if head := strings.TrimSpace(env.Git(clone, "rev-parse", "HEAD")); head != acked {
			t.Errorf("a clone from %s checked out %s, want %s", node, head, acked)
		}
	}
	// A move that has nothing to do is refused with the reason.
	if out, code := packwire(t, "cluster", "move", "team/m", down, holders(p)[0], "--data", nowhere, "--database", url); code == 0 || !strings.Contains(out, "no such node") {
		t.Fatalf("moving from a forgotten node: %d\n%s", code, out)
	}
}
