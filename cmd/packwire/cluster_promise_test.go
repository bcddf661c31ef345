package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/pgtest"
	"packwire/internal/server"
	"packwire/internal/server/cluster"
	"packwire/internal/servertest"
	"packwire/internal/store"
)

// promiseCluster is three in-process nodes on one PostgreSQL holding
// team/app, for the tests of the cluster's promise (a copy is recorded
// at a generation only when its refs are the generation's).
type promiseCluster struct {
	t     *testing.T
	url   string
	db    *store.DB
	dirs  map[string]string
	nodes map[string]*servertest.Server
	admin func(args ...string) string
	env   *gittest.Env
	token string
	work  string
}

func newPromiseCluster(t *testing.T) *promiseCluster {
	c := &promiseCluster{t: t, url: pgtest.Shared(t).NewDatabase(t), dirs: map[string]string{}, nodes: map[string]*servertest.Server{}}
	for _, name := range []string{"a", "b", "c"} {
		c.start(name)
	}
	st, err := store.OpenPostgres(context.Background(), c.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c.db = st.DB
	c.admin = storeAdmin(t, c.url, filepath.Join(t.TempDir(), "none"))
	c.env = c.nodes["a"].Env
	c.admin("repo", "create", "team/app", "--replicas", "3")
	c.token = aliceWrites(c.admin)
	c.work = filepath.Join(t.TempDir(), "work")
	c.env.Git("", "init", "-q", "-b", "main", c.work)
	c.waitAll(0)
	return c
}

func (c *promiseCluster) start(name string) {
	c.nodes[name] = servertest.Start(c.t, func(cfg *server.Config) {
		cfg.Database, cfg.Node, cfg.NodeHeartbeat, cfg.NodeTimeout = c.url, name, 200*time.Millisecond, time.Second
		if d, ok := c.dirs[name]; ok {
			cfg.DataDir = d
		}
		c.dirs[name] = cfg.DataDir
	})
}

func (c *promiseCluster) stop(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.nodes[name].Shutdown(ctx)
}

func (c *promiseCluster) repo() cluster.RepoStatus {
	c.t.Helper()
	var st cluster.Status
	if err := json.Unmarshal([]byte(c.admin("cluster", "status", "--json", "--node-timeout", "1s")), &st); err != nil {
		c.t.Fatal(err)
	}
	for _, r := range st.Repos {
		if r.Name == "team/app" {
			return r
		}
	}
	return cluster.RepoStatus{}
}

func (c *promiseCluster) generationOf(r cluster.RepoStatus, node string) int64 {
	for _, rp := range r.Replicas {
		if rp.Node == node {
			return rp.Generation
		}
	}
	return -2
}

// waitFor polls the repository's status until cond holds.
func (c *promiseCluster) waitFor(what string, cond func(cluster.RepoStatus) bool) cluster.RepoStatus {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := c.repo()
		if cond(r) {
			return r
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s: %+v", what, r)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitAll waits for every copy at generation gen.
func (c *promiseCluster) waitAll(gen int64) cluster.RepoStatus {
	c.t.Helper()
	return c.waitFor(fmt.Sprintf("every copy at generation %d", gen), func(r cluster.RepoStatus) bool {
		ok := r.Generation == gen && len(r.Replicas) == 3
		for _, rp := range r.Replicas {
			ok = ok && rp.Generation == gen
		}
		return ok
	})
}

func (c *promiseCluster) bare(node string) string {
	return filepath.Join(c.dirs[node], "repos", "team", "app.git")
}

// refAt is ref's id in node's copy ("" if missing).
func (c *promiseCluster) refAt(node, ref string) string {
	out, _ := c.env.Run(c.bare(node), nil, "rev-parse", "-q", "--verify", ref)
	return strings.TrimSpace(out)
}

// commit makes a commit in the work tree and returns its id.
func (c *promiseCluster) commit(msg string) string {
	os.WriteFile(filepath.Join(c.work, "f.txt"), []byte(msg+"\n"), 0o644)
	c.env.Git(c.work, "add", ".")
	c.env.Git(c.work, "commit", "-qm", msg)
	return c.env.RevParse(c.work, "HEAD")
}

func (c *promiseCluster) pushURL(node string) string {
	return fmt.Sprintf("http://alice:%s@%s/team/app", c.token, c.nodes[node].HTTPAddr)
}

// firstPush pushes a first commit to main through a, waits for every
// copy at generation 1, and returns the primary and the other nodes.
func (c *promiseCluster) firstPush() (primary string, others []string) {
	c.t.Helper()
	c.commit("one")
	c.env.Git(c.work, "push", "-q", c.pushURL("a"), "main")
	primary = c.waitAll(1).Primary
	for _, n := range []string{"a", "b", "c"} {
		if n != primary {
			others = append(others, n)
		}
	}
	return primary, others
}

// pushHeldAfterCommit pushes HEAD to ref through primary in the
// background, and returns once the push's generation is committed, with
// the primary's git held before it writes its refs until release is
// called (the push's outcome then comes on pushed).
func (c *promiseCluster) pushHeldAfterCommit(primary, ref string) (pushed <-chan error, release func()) {
	c.t.Helper()
	committed, hold := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(hold) }) }
	c.nodes[primary].Router.SetAfterCommit(func(string) {
		committed <- struct{}{}
		select {
		case <-hold:
		case <-time.After(time.Minute):
		}
	})
	result := make(chan error, 1)
	go func() {
		out, err := c.env.Run(c.work, nil, "push", c.pushURL(primary), "HEAD:"+ref)
		if err != nil {
			err = fmt.Errorf("%v: %s", err, out)
		}
		result <- err
	}()
	select {
	case <-committed:
	case err := <-result:
		release()
		c.t.Fatalf("the push ended before its commit: %v", err)
	case <-time.After(30 * time.Second):
		release()
		c.t.Fatal("the push was not committed")
	}
	return result, release
}

// TestClusterNeverRecordsAStaleCopy (issue 29, item 1): a copy is
// recorded at a generation only when its refs are the generation's.
// A push's generation is committed in PostgreSQL and the
// primary's git has not written its refs yet (held there by the test): a
// replica that was down catches up meanwhile. Before, it fetched from
// the primary, without the push, and was recorded at the generation:
// a stale copy recorded current, which failover could promote and
// others catch up from (the lost branch of the issue). Now it is
// recorded only with the branch, fetched from the copy that voted, and
// the primary's own copy only once its git wrote the push.
func TestClusterNeverRecordsAStaleCopy(t *testing.T) {
	t.Parallel()
	c := newPromiseCluster(t)
	primary, others := c.firstPush()
	lagging := others[0]

	c.stop(lagging)
	two := c.commit("two")
	// The primary's git waits, after the generation's commit, until
	// released.
	pushed, release := c.pushHeldAfterCommit(primary, "refs/heads/b2")
	defer release()
	if got := c.refAt(primary, "refs/heads/b2"); got != "" {
		t.Fatalf("the primary's git wrote b2 before the test let it: %s", got)
	}
	// The lagging copy comes back and catches up while the primary's
	// refs lack the push: once recorded at generation 2, it has b2.
	c.start(lagging)
	c.waitFor(lagging+" at generation 2", func(r cluster.RepoStatus) bool { return r.Generation == 2 && c.generationOf(r, lagging) == 2 })
	if got := c.refAt(lagging, "refs/heads/b2"); got != two {
		t.Fatalf("%s is recorded at generation 2 with b2 at %q, want %s: a stale copy recorded current", lagging, got, two)
	}
	if r := c.repo(); c.generationOf(r, primary) != 1 {
		t.Fatalf("the primary's copy is recorded at %d before its git wrote the push's refs", c.generationOf(r, primary))
	}
	release()
	if err := <-pushed; err != nil {
		t.Fatalf("the push: %v", err)
	}
	c.waitAll(2)
	for _, n := range []string{"a", "b", "c"} {
		if got := c.refAt(n, "refs/heads/b2"); got != two {
			t.Fatalf("%s has b2 at %q, want %s", n, got, two)
		}
	}
}

// TestClusterNeverCatchesUpFromAStaleCopy (issue 29, item 1): no
// catch-up or repair takes refs from a copy not proven to hold them. The
// primary's copy, recorded at generation 2, loses a branch behind
// packwire's back: another copy sent to catch up does not fetch from it
// (before: a pruning fetch from the primary deleted the branch there
// too, and the copy was recorded current), and cluster verify repairs
// the primary's copy from the others instead of the others from the
// primary (before: "equal (repaired)", and the branch gone from every
// copy).
func TestClusterNeverCatchesUpFromAStaleCopy(t *testing.T) {
	t.Parallel()
	c := newPromiseCluster(t)
	c.commit("one")
	c.env.Git(c.work, "push", "-q", c.pushURL("a"), "main")
	primary := c.waitAll(1).Primary
	lagging := "a"
	if primary == "a" {
		lagging = "b"
	}
	two := c.commit("two")
	c.env.Git(c.work, "push", "-q", c.pushURL(primary), "HEAD:refs/heads/b2")
	// cluster status --json shows the generation's digest: every copy's.
	r := c.waitAll(2)
	for _, n := range []string{"a", "b", "c"} {
		if d, err := cluster.CopyDigest(c.bare(n)); err != nil || d != r.Digest {
			t.Fatalf("generation 2's digest %q, %s's refs have %q (%v)", r.Digest, n, d, err)
		}
	}
	c.env.Git(c.bare(primary), "update-ref", "-d", "refs/heads/b2")
	if _, err := c.db.Exec("UPDATE replicas SET generation = -1 WHERE repo = 'team/app' AND node = $1", lagging); err != nil {
		t.Fatal(err)
	}
	c.waitFor(lagging+" caught up again", func(r cluster.RepoStatus) bool { return c.generationOf(r, lagging) == 2 })
	if got := c.refAt(lagging, "refs/heads/b2"); got != two {
		t.Fatalf("%s caught up from a copy without b2: b2 at %q, want %s", lagging, got, two)
	}
	// verify repairs the primary's copy, not the others towards it.
	out := c.admin("cluster", "verify", "team/app")
	if strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "team/app" {
			continue
		}
		if repaired := strings.Contains(line, "repaired"); repaired != (f[1] == primary) {
			t.Fatalf("verify should repair the primary's copy %s only, which lacked b2:\n%s", primary, out)
		}
	}
	c.waitAll(2)
	for _, n := range []string{"a", "b", "c"} {
		if got := c.refAt(n, "refs/heads/b2"); got != two {
			t.Fatalf("after verify, %s has b2 at %q, want %s", n, got, two)
		}
		c.env.Git(c.bare(n), "fsck", "--strict")
	}
}

// TestClusterCatchUpNeverPrunesAVotedPush (issue 29, the pg-down loss of
// bench/chaos): a node's catch-up of its copy read the placement (the
// copy behind), then the copy was recorded current (a late record of a
// push it had taken) and voted for the next push, b2, while the
// primary's git had not yet written b2. The catch-up then fetched with
// --prune from the primary, proven at the generation it had read, and
// deleted b2 from a copy recorded at b2's generation: an acknowledged
// push missing from a copy the cluster calls current. Now the catch-up
// and replication take turns on the copy's refs, and a catch-up finding
// its copy current by then leaves it alone.
func TestClusterCatchUpNeverPrunesAVotedPush(t *testing.T) {
	c := newPromiseCluster(t)
	c.commit("one")
	c.env.Git(c.work, "push", "-q", c.pushURL("a"), "main")
	primary := c.waitAll(1).Primary
	lagging := "a"
	if primary == "a" {
		lagging = "b"
	}

	// The lagging node's catch-up stops before it fetches, until released.
	reached, ended := make(chan struct{}, 8), make(chan struct{}, 8)
	release := make(chan struct{})
	var once sync.Once
	releaseCatchUp := func() { once.Do(func() { close(release) }) }
	defer releaseCatchUp()
	c.nodes[lagging].Router.SetCatchUpHook(func(repo, at string) {
		if repo != "team/app" {
			return
		}
		switch at {
		case "bring":
			reached <- struct{}{}
			select {
			case <-release:
			case <-time.After(time.Minute):
			}
		case "end":
			ended <- struct{}{}
		}
	})
	if _, err := c.db.Exec("UPDATE replicas SET generation = 0 WHERE repo = 'team/app' AND node = $1", lagging); err != nil {
		t.Fatal(err)
	}
	// Its node's next tick catches it up; asked at once here too (one
	// catch-up runs, the other waits for it).
	go c.nodes[lagging].Router.Reconcile(context.Background())
	select {
	case <-reached:
	case <-time.After(60 * time.Second):
		t.Fatal("the lagging copy's catch-up did not start")
	}
	// Meanwhile its copy is recorded current again (it never lacked
	// generation 1: a push's late record), and takes the next push.
	if _, err := c.db.Exec("UPDATE replicas SET generation = 1 WHERE repo = 'team/app' AND node = $1", lagging); err != nil {
		t.Fatal(err)
	}
	two := c.commit("two")
	pushed, letGitWrite := c.pushHeldAfterCommit(primary, "refs/heads/b2")
	defer letGitWrite()
	c.waitFor(lagging+" recorded at generation 2", func(r cluster.RepoStatus) bool { return c.generationOf(r, lagging) == 2 })
	if got := c.refAt(lagging, "refs/heads/b2"); got != two {
		t.Fatalf("%s is recorded at generation 2 with b2 at %q, want %s", lagging, got, two)
	}
	if got := c.refAt(primary, "refs/heads/b2"); got != "" {
		t.Fatalf("the primary's git wrote b2 before the test let it: %s", got)
	}
	// The catch-up goes on while the primary's refs still lack b2.
	releaseCatchUp()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the lagging copy's catch-up did not end")
	}
	if got := c.refAt(lagging, "refs/heads/b2"); got != two {
		t.Fatalf("%s's catch-up deleted b2 (now %q) from a copy recorded at its generation", lagging, got)
	}
	letGitWrite()
	if err := <-pushed; err != nil {
		t.Fatalf("the push: %v", err)
	}
	c.waitAll(2)
	for _, n := range []string{"a", "b", "c"} {
		if got := c.refAt(n, "refs/heads/b2"); got != two {
			t.Fatalf("%s has b2 at %q, want %s", n, got, two)
		}
	}
}

// TestClusterUndoesAPushItsDeadPrimaryNeverCommitted (issue 29, the
// wedge): the primary takes a push to every other copy, then dies before
// the push's commit. Both copies left hold a push that was never
// acknowledged and are recorded at the generation before it, so neither
// holds that generation's refs, and the only copy that does is down.
// Before, no copy could be caught up from, so the repository took no
// push until the old primary came back (forever, were it lost). Now each
// copy undoes the push, with the repository's pushes held, before any
// push comes, and a push through them is acknowledged; the push that was never
// acknowledged is on no copy, the old primary included once it is back.
func TestClusterUndoesAPushItsDeadPrimaryNeverCommitted(t *testing.T) {
	t.Parallel()
	c := newPromiseCluster(t)
	primary, others := c.firstPush()

	c.nodes[primary].Router.SetDieBeforeCommit(func(string) bool { return true })
	c.commit("never acknowledged")
	if out, err := c.env.Run(c.work, nil, "push", c.pushURL(primary), "HEAD:refs/heads/lost"); err == nil {
		t.Fatalf("the push the primary died in was acknowledged:\n%s", out)
	}
	for _, n := range others {
		if c.refAt(n, "refs/heads/lost") == "" {
			t.Fatalf("%s did not take the push before the primary's end: the test would test nothing", n)
		}
	}
	c.stop(primary)
	start := time.Now()
	// With no push coming, each copy left undoes it on its own (a read
	// from it would otherwise show a push never acknowledged).
	for _, n := range others {
		for c.refAt(n, "refs/heads/lost") != "" {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("%s still holds the unacknowledged push 30 s after its primary died", n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("the unacknowledged push undone on both copies left %.1f s after the primary's death", time.Since(start).Seconds())

	after := c.commit("after")
	for {
		out, err := c.env.Run(c.work, nil, "push", c.pushURL(others[0]), "HEAD:refs/heads/after")
		if err == nil {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("no push acknowledged 30 s after the primary died (the copies left hold its unacknowledged push): %v\n%s", err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("a push acknowledged %.1f s after the primary's death", time.Since(start).Seconds())
	c.start(primary)
	c.waitAll(2)
	want := c.env.Git(c.bare(others[0]), "for-each-ref")
	for _, n := range []string{"a", "b", "c"} {
		if got := c.refAt(n, "refs/heads/lost"); got != "" {
			t.Errorf("%s has the unacknowledged push's branch at %s", n, got)
		}
		if got := c.refAt(n, "refs/heads/after"); got != after {
			t.Errorf("%s has the acknowledged branch at %q, want %s", n, got, after)
		}
		if got := c.env.Git(c.bare(n), "for-each-ref"); got != want {
			t.Errorf("%s's refs:\n%s\n%s's:\n%s", n, got, others[0], want)
		}
		c.env.Fsck(c.bare(n))
	}
}
