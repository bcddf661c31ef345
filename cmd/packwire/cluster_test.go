package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/gittest"
	"packwire/internal/governor"
	"packwire/internal/mirror"
	"packwire/internal/needs"
	"packwire/internal/pgtest"
	"packwire/internal/repo"
	"packwire/internal/server"
	"packwire/internal/server/cluster"
	"packwire/internal/server/cluster/route"
	"packwire/internal/servertest"
	"packwire/internal/store"
)

// TestClusterReplicatesAndFailsOver: four nodes on one PostgreSQL. A
// repository created with the CLI appears on three of them; a push to its
// primary is on a majority of the replicas before git's report reaches
// the client, and on every replica (fsck-clean) moments later; the
// replication endpoint refuses clients' credentials; pushes to another
// node (HTTP, SSH) are relayed to the primary; every node serves a clone over git://, SSH and HTTP, the one
// without a copy by relaying; when the primary's node stops, an up-to-date
// replica is promoted within 10 s and takes pushes (2 of 3 is a
// majority); the stopped node, started again, catches up before it serves.
func TestClusterReplicatesAndFailsOver(t *testing.T) {
	t.Parallel()
	url := pgtest.Shared(t).NewDatabase(t)
	const heartbeat, timeout = 200 * time.Millisecond, time.Second
	dirs := map[string]string{}
	var serverLog lockedBuffer
	defer func() {
		// A relay must never leave the HTTP server reading a connection
		// git's side still reads ("invalid concurrent Body.Read call").
		if strings.Contains(serverLog.String(), "panic") {
			t.Errorf("a node panicked:\n%s", serverLog.String())
		}
	}()
	start := func(name string) *servertest.Server {
		return servertest.Start(t, func(c *server.Config) {
			c.Database, c.Node, c.NodeHeartbeat, c.NodeTimeout = url, name, heartbeat, timeout
			c.Log = slog.New(slog.NewTextHandler(&serverLog, &slog.HandlerOptions{Level: slog.LevelWarn}))
			if d, ok := dirs[name]; ok {
				c.DataDir = d
			}
			dirs[name] = c.DataDir
		})
	}
	nodes := map[string]*servertest.Server{"a": start("a"), "b": start("b"), "c": start("c"), "d": start("d")}
	env := nodes["a"].Env
	admin := storeAdmin(t, url, filepath.Join(t.TempDir(), "none"))
	status := func() cluster.Status {
		t.Helper()
		var st cluster.Status
		if err := json.Unmarshal([]byte(admin("cluster", "status", "--json", "--node-timeout", timeout.String())), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	waitFor := func(what string, within time.Duration, cond func(cluster.Status) bool) cluster.Status {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			st := status()
			if cond(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, st)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	repoOf := func(st cluster.Status) cluster.RepoStatus {
		for _, r := range st.Repos {
			if r.Name == "team/app" {
				return r
			}
		}
		return cluster.RepoStatus{}
	}
	allAt := func(gen int64, among ...string) func(cluster.Status) bool {
		return func(st cluster.Status) bool {
			r := repoOf(st)
			if r.Generation != gen {
				return false
			}
			at := map[string]bool{}
			for _, rp := range r.Replicas {
				at[rp.Node] = rp.Generation == gen
			}
			for _, n := range among {
				if !at[n] {
					return false
				}
			}
			return true
		}
	}

	out := admin("repo", "create", "team/app", "--replicas", "3")
	if !strings.Contains(out, "placed team/app on a, b, c") {
		t.Fatalf("repo create in a cluster:\n%s", out)
	}
	st := waitFor("every copy created", 10*time.Second, allAt(0, "a", "b", "c"))
	primary := repoOf(st).Primary
	token := aliceWrites(admin)
	pushURL := func(n *servertest.Server) string {
		return fmt.Sprintf("http://alice:%s@%s/team/app", token, n.HTTPAddr)
	}
	bare := func(name string) string { return filepath.Join(dirs[name], "repos", "team", "app.git") }

	// The replication endpoint takes the cluster user only: a client's
	// token with write access to the repository is refused.
	clusterOnly(t, "http://"+nodes["b"].HTTPAddr.String()+route.ReplicatePath, "x", token, "X-Packwire-Repo", "team/app")
	clusterOnly(t, "http://"+nodes["b"].HTTPAddr.String()+route.RelayPath, "", token, "X-Packwire-Repo", "team/app", "X-Packwire-Service", "git-upload-pack")

	// A push to the primary is on every replica when the client has its report.
	work := filepath.Join(t.TempDir(), "work")
	env.Git("", "init", "-q", "-b", "main", work)
	commit := func(msg string) string {
		os.WriteFile(filepath.Join(work, "f.txt"), []byte(msg+"\n"), 0o644)
		env.Git(work, "add", ".")
		env.Git(work, "commit", "-qm", msg)
		return env.RevParse(work, "HEAD")
	}
	first := commit("one")
	env.Git(work, "push", "-q", pushURL(nodes[primary]), "main")
	replicas := []string{"a", "b", "c"}
	// A push is answered once a majority holds it (2 of 3, the primary
	// counted); the third copy takes it moments later.
	mainAt := func(name string) string {
		out, _ := env.Run(bare(name), nil, "rev-parse", "-q", "--verify", "refs/heads/main")
		return strings.TrimSpace(out)
	}
	onReplicas := func(want string) {
		t.Helper()
		holding := 0
		for _, name := range replicas {
			if mainAt(name) == want {
				holding++
			}
		}
		if holding < 2 {
			t.Fatalf("only %d of 3 copies have main at %s right after the push", holding, want)
		}
		for _, name := range replicas {
			for deadline := time.Now().Add(5 * time.Second); mainAt(name) != want; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("node %s never got main at %s", name, want)
				}
			}
			env.Git(bare(name), "fsck", "--strict")
		}
	}
	onReplicas(first)
	waitFor("generation 1 everywhere", 5*time.Second, allAt(1, replicas...))

	// Pushes to other nodes are relayed to the primary: HTTP from d
	// (which holds no copy), SSH from a replica.
	var other string
	for _, name := range replicas {
		if name != primary {
			other = name
			break
		}
	}
	second := commit("two")
	env.Git(work, "push", "-q", pushURL(nodes["d"]), "main")
	onReplicas(second)
	key := env.NewSSHKey("alice")
	admin("key", "add", "alice", key+".pub")
	sshEnv := []string{gittest.SSHCommandEnv(key)}
	third := commit("three")
	if out, err := env.Run(work, sshEnv, "push", nodes[other].SSHURL("team/app"), "main"); err != nil {
		t.Fatalf("SSH push relayed from %s: %v\n%s", other, err, out)
	}
	onReplicas(third)
	waitFor("generation 3 everywhere", 5*time.Second, allAt(3, replicas...))
	if _, err := os.Stat(bare("d")); !os.IsNotExist(err) {
		t.Fatalf("node d, which holds no copy, has one: %v", err)
	}
	// Every node serves a clone on every transport, d by relaying; v2 used.
	for name, n := range nodes {
		for _, c := range []struct {
			url string
			env []string
		}{
			{n.GitURL("team/app"), nil}, {n.HTTPURL("team/app"), nil}, {n.SSHURL("team/app"), sshEnv},
		} {
			clone := filepath.Join(t.TempDir(), "clone")
			out, err := env.Run("", append([]string{"GIT_TRACE_PACKET=1"}, c.env...), "clone", c.url, clone)
			if err != nil || !strings.Contains(out, "< version 2") {
				t.Fatalf("clone %s from %s: %v\n%s", c.url, name, err, lastLines(out))
			}
			if got := env.RevParse(clone, "HEAD"); got != third {
				t.Fatalf("clone %s from %s at %s, want %s", c.url, name, got, third)
			}
		}
	}
	// Every node writes its records to PostgreSQL, each naming its node:
	// "governor --database" from a machine with no data directory, and
	// the governor of any node (its dashboard), show the whole cluster.
	var byNode struct {
		Groups []governor.Group `json:"groups"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if err := json.Unmarshal([]byte(admin("governor", "--by", "node", "--json")), &byNode); err != nil {
			t.Fatal(err)
		}
		if len(byNode.Groups) == 4 { // each node served clones
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("governor --by node: %+v, want a, b, c and d", byNode.Groups)
		}
	}
	var total int64
	for _, g := range byNode.Groups {
		if nodes[g.Key] == nil || g.Count == 0 {
			t.Fatalf("governor --by node: a group %+v", g)
		}
		total += g.Count
	}
	// A relayed request is in both nodes' groups, and once in the totals
	// (where it was served): taken after the groups, the relays seen then
	// are at least those the groups held.
	relayed := int64(0)
	for _, line := range strings.Split(strings.TrimSpace(admin("governor", "--last", "5000", "--json")), "\n") {
		var r governor.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		if r.PackCache == governor.PackCacheRelayed {
			relayed++
		}
	}
	costs, err := nodes["a"].Governor.Costs(context.Background(), time.Now().Add(-time.Hour), time.Now(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if costs.Total.Requests < total-relayed || len(costs.By["node"].Groups) != 4 {
		t.Fatalf("node a's Costs: %d requests by %+v; governor --by node had %d, %d of them relays", costs.Total.Requests, costs.By["node"].Groups, total, relayed)
	}
	// d's records (--node d) say it relayed.
	relayedOnD := 0
	for _, line := range strings.Split(strings.TrimSpace(admin("governor", "--last", "500", "--node", "d", "--json")), "\n") {
		var r governor.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		if r.Node != "d" {
			t.Fatalf("governor --node d printed a record of node %q", r.Node)
		}
		if r.PackCache == governor.PackCacheRelayed && r.Repo == "team/app" {
			relayedOnD++
		}
	}
	if relayedOnD == 0 {
		t.Fatal("node d recorded no relayed request")
	}
	second = commit("four")

	// The primary stops; a replica is promoted within 10 s and takes pushes.
	stopped := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	nodes[primary].Shutdown(ctx)
	cancel()
	st = waitFor("a new primary", 10*time.Second, func(st cluster.Status) bool {
		p := repoOf(st).Primary
		return p != primary && p != ""
	})
	failover := time.Since(stopped)
	newPrimary := repoOf(st).Primary
	t.Logf("failover %s -> %s in %s", primary, newPrimary, failover.Round(10*time.Millisecond))
	env.Git(work, "push", "-q", pushURL(nodes[newPrimary]), "main")
	var survivors []string
	for _, name := range replicas {
		if name != primary {
			survivors = append(survivors, name)
			if got := env.RevParse(bare(name), "refs/heads/main"); got != second {
				t.Fatalf("node %s has main at %s after the failover push, want %s", name, got, second)
			}
		}
	}
	waitFor("generation 4 on the survivors", 5*time.Second, allAt(4, survivors...))

	// With two of three copies down, a push cannot reach a majority: it is
	// refused, and the client is told why over HTTP too.
	var down string
	for _, name := range survivors {
		if name != newPrimary {
			down = name
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	nodes[down].Shutdown(ctx)
	cancel()
	waitFor(down+" unhealthy", 10*time.Second, func(st cluster.Status) bool {
		for _, n := range st.Nodes {
			if n.Name == down {
				return !n.Healthy
			}
		}
		return false
	})
	lost := commit("not on a majority")
	out, err = env.Run(work, nil, "push", pushURL(nodes[newPrimary]), "main")
	if err == nil || !strings.Contains(out, "[remote rejected] main -> main (cluster: only 1 of 3 replicas") {
		t.Fatalf("push without a majority: %v\n%s", err, out)
	}
	if got := env.RevParse(bare(newPrimary), "refs/heads/main"); got == lost {
		t.Fatal("the primary kept a push no majority took")
	}
	env.Git(work, "reset", "-q", "--hard", second)

	// The old primary comes back behind, and catches up before serving.
	nodes[down] = start(down)
	nodes[primary] = start(primary)
	waitFor("the old primary caught up", 10*time.Second, allAt(4, replicas...))
	if got := env.RevParse(bare(primary), "refs/heads/main"); got != second {
		t.Fatalf("restarted %s has main at %s, want %s", primary, got, second)
	}
	env.Git(bare(primary), "fsck", "--strict")
	// verify finds every copy equal; a copy changed behind packwire's back
	// is repaired from the primary.
	if out := admin("cluster", "verify", "team/app"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify:\n%s", out)
	}
	rogue := survivors[0]
	if rogue == newPrimary {
		rogue = survivors[1]
	}
	env.Git(bare(rogue), "update-ref", "refs/heads/rogue", first)
	out = admin("cluster", "verify", "team/app")
	if !strings.Contains(out, "equal (repaired)") {
		t.Fatalf("cluster verify after a rogue ref on %s:\n%s", rogue, out)
	}
	if _, err := env.Run(bare(rogue), nil, "rev-parse", "--verify", "-q", "refs/heads/rogue"); err == nil {
		t.Fatalf("the rogue ref on %s survived the repair", rogue)
	}
	// repo import: the primary imports, the others catch up from it.
	src := filepath.Join(t.TempDir(), "src.git")
	env.Git("", "init", "-q", "--bare", src)
	env.Git(work, "push", "-q", src, "main:main", "main:refs/tags/v1")
	admin("repo", "import", "team/imported", src)
	waitFor("the import on every replica", 15*time.Second, func(st cluster.Status) bool {
		for _, r := range st.Repos {
			if r.Name != "team/imported" || r.Generation != 1 {
				continue
			}
			for _, rp := range r.Replicas {
				if rp.Generation != 1 {
					return false
				}
			}
			return true
		}
		return false
	})
	if out := admin("cluster", "verify", "team/imported"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify of the import:\n%s", out)
	}
	// repo sync asks the cluster, not this node's copy (which is not a mirror).
	if out, code := packwire(t, "repo", "sync", "team/app", "--database", url, "--data", dirs["a"]); code == 0 || !strings.Contains(out, "not a pull mirror") {
		t.Fatalf("repo sync of no mirror in a cluster: %d\n%s", code, out)
	}
	text := admin("cluster", "status")
	if !strings.Contains(text, "team/app") || !strings.Contains(text, newPrimary) {
		t.Fatalf("cluster status:\n%s", text)
	}
}

// lastLines keeps a failure's output readable: GIT_TRACE_PACKET is long.
func lastLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// lockedBuffer collects the nodes' log lines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestClusterSurvivesPostgresRestart: PostgreSQL restarted while a client
// pushes: pushes in flight finish or fail with a message, the nodes
// reconnect by themselves, pushes are accepted again, and every
// acknowledged push is on every copy.
func TestClusterSurvivesPostgresRestart(t *testing.T) {
	t.Parallel()
	pg := pgtest.Start(t)
	url := pg.NewDatabase(t)
	var nodes []*servertest.Server
	for _, name := range []string{"a", "b", "c"} {
		nodes = append(nodes, servertest.Start(t, func(c *server.Config) {
			c.Database, c.Node, c.NodeHeartbeat, c.NodeTimeout = url, name, 200*time.Millisecond, time.Second
		}))
	}
	admin := storeAdmin(t, url, filepath.Join(t.TempDir(), "none"))
	admin("repo", "create", "app")
	admin("user", "add", "ci")
	admin("grant", "ci", "write", "**")
	lines := strings.Split(strings.TrimSpace(admin("token", "create", "ci")), "\n")
	token := lines[len(lines)-1]
	env := nodes[0].Env
	work := filepath.Join(t.TempDir(), "work")
	env.Git("", "init", "-q", "-b", "main", work)
	var restarted atomic.Bool
	var acked string
	var ackedAfter, failed int
	// A safety net, not a bound: the loop ends at the third push accepted
	// after the restart. 20 s ran out at a load average of 50 on 2 cores,
	// pushes taking 5 to 7 s each.
	deadline := time.Now().Add(2 * time.Minute)
	go func() {
		time.Sleep(2 * time.Second)
		if err := pg.Restart(); err != nil {
			t.Error(err)
		}
		restarted.Store(true)
	}()
	for i := 0; time.Now().Before(deadline) && (ackedAfter < 3 || !restarted.Load()); i++ {
		os.WriteFile(filepath.Join(work, "f"), []byte(fmt.Sprintf("%d\n", i)), 0o644)
		env.Git(work, "add", ".")
		env.Git(work, "commit", "-qm", fmt.Sprint(i))
		n := nodes[i%3]
		began := time.Now()
		// A transfer stalled for 20 s fails the push (and says so) rather
		// than hold the test.
		out, err := env.Run(work, []string{"GIT_HTTP_LOW_SPEED_LIMIT=1", "GIT_HTTP_LOW_SPEED_TIME=20"}, "push", fmt.Sprintf("http://ci:%s@%s/app", token, n.HTTPAddr), "HEAD:main")
		t.Logf("push %d to node %d (restarted %v): %v in %v", i, i%3, restarted.Load(), err, time.Since(began).Round(time.Millisecond))
		if err == nil {
			acked = env.RevParse(work, "HEAD")
			if restarted.Load() {
				ackedAfter++
			}
			continue
		}
		failed++
		t.Logf("  %s", lastLines(out))
		if !strings.Contains(out, "remote rejected") && !strings.Contains(out, "returned error") && !strings.Contains(out, "RPC failed") &&
			!strings.Contains(out, "Operation too slow") {
			t.Errorf("a push failed without saying why:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ackedAfter < 3 {
		t.Fatalf("pushes were not accepted again after PostgreSQL's restart (%d failed)", failed)
	}
	t.Logf("%d pushes failed around the restart; %d accepted after it", failed, ackedAfter)
	if out := admin("cluster", "verify", "app", "--wait", "20s"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify:\n%s", out)
	}
	for _, n := range nodes {
		if got := env.RevParse(filepath.Join(n.Data.Dir, "repos", "app.git"), "refs/heads/main"); got != acked {
			t.Errorf("a node has main at %s, the last acknowledged push is %s", got, acked)
		}
	}
}

// TestClusterRepoCommands: the commands that change a repository's files
// change every copy of a cluster's. repo create --default-branch and repo
// set-head set HEAD on every node (a clone from any node checks that
// branch out), repo set-description writes each copy's description; repo
// delete answers "not found" on every node at once (over each transport),
// each node moves its copy into its trash, a push in flight cannot
// resurrect it, and the name can be created again once the copies are
// gone, without the old deletion touching the new copies.
func TestClusterRepoCommands(t *testing.T) {
	t.Parallel()
	url := pgtest.Shared(t).NewDatabase(t)
	const heartbeat, timeout = 200 * time.Millisecond, time.Second
	nodes := startNodes(t, url, []string{"a", "b", "c"}, heartbeat, timeout, nil)
	env := nodes["a"].Env
	admin := storeAdmin(t, url, filepath.Join(t.TempDir(), "none"))
	token := aliceWrites(admin)
	bare := func(node string) string { return filepath.Join(nodes[node].Data.Dir, "repos", "team", "gone.git") }
	exists := func(path string) bool { _, err := os.Stat(path); return err == nil }
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	headOf := func(node string) string {
		b, _ := os.ReadFile(filepath.Join(bare(node), "HEAD"))
		return strings.TrimSpace(string(b))
	}
	everyCopy := func(what string, cond func(node string) bool) {
		t.Helper()
		waitUntil(what+" on every copy", func() bool { return cond("a") && cond("b") && cond("c") })
	}
	admin("repo", "create", "team/gone", "--replicas", "3", "--default-branch", "trunk")
	everyCopy("HEAD -> trunk", func(n string) bool { return headOf(n) == "ref: refs/heads/trunk" })
	work := filepath.Join(t.TempDir(), "work")
	env.Git("", "init", "-q", "-b", "main", work)
	os.WriteFile(filepath.Join(work, "f.txt"), []byte("one\n"), 0o644)
	env.Git(work, "add", ".")
	env.Git(work, "commit", "-qm", "one")
	pushURL := fmt.Sprintf("http://alice:%s@%s/team/gone", token, nodes["b"].HTTPAddr)
	env.Git(work, "push", "-q", pushURL, "main", "main:trunk")
	if out, code := packwire(t, "repo", "set-head", "team/gone", "nope", "--data", filepath.Join(t.TempDir(), "none"), "--database", url); code == 0 || !strings.Contains(out, `no branch "nope"`) {
		t.Fatalf("set-head to a missing branch: %d\n%s", code, out)
	}
	admin("repo", "set-head", "team/gone", "main")
	everyCopy("HEAD -> main", func(n string) bool { return headOf(n) == "ref: refs/heads/main" })
	for name, n := range nodes {
		clone := filepath.Join(t.TempDir(), "clone-"+name)
		env.Git("", "clone", "-q", "git://"+n.GitAddr.String()+"/team/gone", clone)
		if got := env.Git(clone, "symbolic-ref", "HEAD"); strings.TrimSpace(got) != "refs/heads/main" {
			t.Fatalf("a clone from node %s checked out %s, want main", name, got)
		}
	}
	// HEAD follows a first push of another branch on every copy, as on
	// one server (HEAD is not a ref: replication alone would not carry it).
	admin("repo", "create", "team/first", "--replicas", "3")
	firstHead := func(node string) string {
		b, _ := os.ReadFile(filepath.Join(nodes[node].Data.Dir, "repos", "team", "first.git", "HEAD"))
		return strings.TrimSpace(string(b))
	}
	waitUntil("team/first on every node", func() bool { return firstHead("a") != "" && firstHead("b") != "" && firstHead("c") != "" })
	env.Git(work, "push", "-q", fmt.Sprintf("http://alice:%s@%s/team/first", token, nodes["c"].HTTPAddr), "main:dev")
	everyCopy("team/first's HEAD -> dev", func(n string) bool { return firstHead(n) == "ref: refs/heads/dev" })

	// A quota on every copy: a push over it is refused by the primary.
	if out := admin("repo", "quota", "team/first", "1"); !strings.Contains(out, "a 1 B quota on every copy") {
		t.Fatalf("repo quota in a cluster:\n%s", out)
	}
	everyCopy("team/first's quota", func(n string) bool {
		out, err := env.Run("", nil, "--git-dir", filepath.Join(nodes[n].Data.Dir, "repos", "team", "first.git"), "config", "packwire.quota")
		return err == nil && strings.TrimSpace(out) == "1"
	})
	os.WriteFile(filepath.Join(work, "g.txt"), []byte("two\n"), 0o644)
	env.Git(work, "add", ".")
	env.Git(work, "commit", "-qm", "two")
	if out, err := env.Run(work, nil, "push", fmt.Sprintf("http://alice:%s@%s/team/first", token, nodes["a"].HTTPAddr), "main:dev"); err == nil || !strings.Contains(out, "quota") {
		t.Fatalf("a push over the cluster's quota: %v\n%s", err, out)
	}
	// Once quota off returns, the primary has it: the push below (after a
	// rename) was refused over the old quota when it came too soon.
	if out := admin("repo", "quota", "team/first", "off"); !strings.Contains(out, "no quota on its copies; its primary applied it") {
		t.Fatalf("repo quota off in a cluster:\n%s", out)
	}
	if out := admin("repo", "quota", "team/first"); !strings.Contains(out, "no quota") {
		t.Fatalf("repo quota after off:\n%s", out)
	}

	// A rename: the new name answers at once on every node and transport
	// (each node moves its copy before it serves it), the old one is not
	// found, and pushes and replication go on under the new name.
	if out := admin("repo", "rename", "team/first", "team/second"); !strings.Contains(out, "renamed team/first to team/second in the cluster") {
		t.Fatalf("repo rename in a cluster:\n%s", out)
	}
	for name, n := range nodes {
		for _, base := range []string{"git://" + n.GitAddr.String(), fmt.Sprintf("http://alice:%s@%s", token, n.HTTPAddr)} {
			out, err := env.Run("", nil, "ls-remote", base+"/team/second")
			if err != nil || !strings.Contains(out, "refs/heads/dev") {
				t.Fatalf("node %s, %s/team/second right after the rename: %v\n%s", name, base, err, out)
			}
			if out, err := env.Run("", nil, "ls-remote", base+"/team/first"); err == nil || !strings.Contains(out, "not found") {
				t.Fatalf("node %s, %s/team/first after the rename: %v\n%s", name, base, err, out)
			}
		}
	}
	env.Git(work, "push", "-q", fmt.Sprintf("http://alice:%s@%s/team/second", token, nodes["b"].HTTPAddr), "main:dev")
	secondCopy := func(node string) string { return filepath.Join(nodes[node].Data.Dir, "repos", "team", "second.git") }
	everyCopy("team/second on disk", func(n string) bool {
		return exists(secondCopy(n)) && !exists(filepath.Join(nodes[n].Data.Dir, "repos", "team", "first.git"))
	})
	if out := admin("cluster", "verify", "team/second", "--wait", "15s"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify after the rename and a push:\n%s", out)
	}
	for name := range nodes {
		env.Git(secondCopy(name), "fsck", "--strict")
		if got := env.Git(secondCopy(name), "rev-parse", "dev"); got != env.Git(work, "rev-parse", "main") {
			t.Fatalf("node %s: team/second's dev is %s after the push", name, got)
		}
	}
	// dulwich, a second git implementation, through every node: pushes
	// relayed to the primary or served there, clones from each copy.
	dwork := filepath.Join(t.TempDir(), "dulwich-work")
	env.Git("", "clone", "-q", work, dwork)
	for name, n := range nodes {
		os.WriteFile(filepath.Join(dwork, "d.txt"), []byte("dulwich via "+name+"\n"), 0o644)
		env.Git(dwork, "add", ".")
		env.Git(dwork, "commit", "-qm", "for dulwich via "+name)
		want := strings.TrimSpace(env.Git(dwork, "rev-parse", "HEAD"))
		url := fmt.Sprintf("http://alice:%s@%s/team/second", token, n.HTTPAddr)
		dulwich(t, `
import sys
from dulwich import porcelain
porcelain.push(sys.argv[1], sys.argv[2], [b"HEAD:refs/heads/dulwich"], errstream=sys.stderr.buffer)
porcelain.clone(sys.argv[3], sys.argv[4], bare=True, errstream=sys.stderr.buffer)
`, dwork, url, "git://"+nodes[map[string]string{"a": "b", "b": "c", "c": "a"}[name]].GitAddr.String()+"/team/second", filepath.Join(t.TempDir(), "dulwich-clone"))
		for other := range nodes {
			waitUntil("dulwich's push via "+name+" on node "+other, func() bool {
				got, _ := env.Run(secondCopy(other), nil, "rev-parse", "--verify", "-q", "refs/heads/dulwich")
				return strings.TrimSpace(got) == want
			})
			env.Git(secondCopy(other), "fsck", "--strict")
		}
	}
	for _, bad := range [][2]string{{"team/second", "team/gone"}, {"team/second", "team/gone/inner"}, {"team/nothing", "team/else"}} {
		if out, code := packwire(t, "repo", "rename", bad[0], bad[1], "--database", url, "--data", filepath.Join(t.TempDir(), "none")); code == 0 {
			t.Fatalf("repo rename %s %s was taken:\n%s", bad[0], bad[1], out)
		}
	}

	admin("repo", "set-description", "team/gone", "The app that goes")
	everyCopy("the description", func(n string) bool {
		b, _ := os.ReadFile(filepath.Join(bare(n), "description"))
		return string(b) == "The app that goes\n"
	})

	out := admin("repo", "delete", "team/gone")
	if !strings.Contains(out, "deleted team/gone from the cluster") {
		t.Fatalf("repo delete in a cluster:\n%s", out)
	}
	// Not found at once, on every node and transport (git's wording).
	for name, n := range nodes {
		for _, remote := range []string{"git://" + n.GitAddr.String() + "/team/gone", fmt.Sprintf("http://alice:%s@%s/team/gone", token, n.HTTPAddr)} {
			out, err := env.Run("", nil, "ls-remote", remote)
			if err == nil || !strings.Contains(out, "not found") {
				t.Fatalf("node %s, %s after the delete: %v\n%s", name, remote, err, out)
			}
		}
	}
	if out, err := env.Run(work, nil, "push", "-q", pushURL, "main:other"); err == nil {
		t.Fatalf("a push to the deleted repository was taken:\n%s", out)
	}
	for name := range nodes {
		waitUntil("node "+name+" to move its copy into its trash", func() bool {
			trashed, _ := nodes[name].Data.Repos.ListTrash()
			return !exists(bare(name)) && len(trashed) == 1 && trashed[0].Name == "team/gone"
		})
	}
	if out := admin("cluster", "status", "--json"); strings.Contains(out, "team/gone") {
		t.Fatalf("cluster status still lists the deleted repository:\n%s", out)
	}
	// The cluster's trash, and a restore: every copy back at once, with
	// its refs, served and replicated as before.
	if out := admin("repo", "trash"); !strings.Contains(out, "team/gone") || !strings.Contains(out, "on a, b, c") {
		t.Fatalf("repo trash in a cluster:\n%s", out)
	}
	if out := admin("repo", "restore", "team/gone"); !strings.Contains(out, "restored team/gone in the cluster on a, b, c") {
		t.Fatalf("repo restore in a cluster:\n%s", out)
	}
	pushed := strings.TrimSpace(env.Git(work, "rev-parse", "main~1"))
	for name, n := range nodes {
		out, err := env.Run("", nil, "ls-remote", "git://"+n.GitAddr.String()+"/team/gone")
		if err != nil || !strings.Contains(out, pushed+"\trefs/heads/trunk") {
			t.Fatalf("node %s right after the restore: %v\n%s", name, err, out)
		}
	}
	// The settings came back with the copies: a copy fetched again would
	// get them, and the next change starts from them.
	probe, err := datadir.OpenWith(context.Background(), filepath.Join(t.TempDir(), "probe"), url)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if st, err := cluster.RepoSettings(context.Background(), probe.Store.DB, "team/gone"); err != nil || st.Head != "main" || st.Description == nil || *st.Description != "The app that goes" {
		t.Fatalf("team/gone's settings after the restore: %+v %v", st, err)
	}
	env.Git(work, "push", "-q", pushURL, "main:restored")
	if out := admin("cluster", "verify", "team/gone", "--wait", "15s"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify after the restore and a push:\n%s", out)
	}
	if out := admin("repo", "trash"); strings.Contains(out, "team/gone") {
		t.Fatalf("repo trash still lists the restored repository:\n%s", out)
	}
	admin("repo", "delete", "team/gone")
	for name := range nodes {
		waitUntil("node "+name+" to move its copy into its trash again", func() bool {
			trashed, _ := nodes[name].Data.Repos.ListTrash()
			return !exists(bare(name)) && len(trashed) == 1
		})
	}

	// The name again: a new, empty repository on every node.
	admin("repo", "create", "team/gone", "--replicas", "3")
	waitUntil("every new copy created", func() bool { return exists(bare("a")) && exists(bare("b")) && exists(bare("c")) })
	time.Sleep(3 * heartbeat) // a stale deletion would strike within a tick
	for name := range nodes {
		if !exists(bare(name)) {
			t.Fatalf("node %s lost the new copy", name)
		}
		if refs := env.Git(bare(name), "for-each-ref"); refs != "" {
			t.Fatalf("node %s: the new repository has refs of the old one:\n%s", name, refs)
		}
	}
	if out, code := packwire(t, "repo", "restore", "team/gone", "--database", url, "--data", filepath.Join(t.TempDir(), "none")); code == 0 || !strings.Contains(out, "exists") {
		t.Fatalf("restoring over a repository of the same name: %d\n%s", code, out)
	}
	// A copy of a repository no push ever reached that has a ref (a push
	// failed after the copy took it) is repaired by cluster verify: the
	// ref is dropped, as a fetch from the empty primary would.
	tree := strings.TrimSpace(env.Git(bare("b"), "mktree"))
	stray := strings.TrimSpace(env.Git(bare("b"), "commit-tree", "-m", "stray", tree))
	env.Git(bare("b"), "update-ref", "refs/heads/stray", stray)
	if out := admin("cluster", "verify", "team/gone", "--wait", "15s"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify of a stray ref at generation 0:\n%s", out)
	}
	if refs := env.Git(bare("b"), "for-each-ref"); refs != "" {
		t.Fatalf("node b kept refs the repository never had:\n%s", refs)
	}
}

// TestClusterMirrors: a read-only pull mirror of a private upstream
// (another packwire, read with a token) imported into a three-node
// cluster: the primary imports it with the token its settings keep,
// every copy refuses pushes, an on-demand sync from an admin machine with
// no copy (repo sync) and the primary's own scheduled syncs are
// replicated to every copy as pushes are; a push mirror added in the
// cluster gets the pushes; the token is in no copy's config and no
// output.
func TestClusterMirrors(t *testing.T) {
	t.Parallel()
	url := pgtest.Shared(t).NewDatabase(t)
	nodes := map[string]*servertest.Server{}
	for _, name := range []string{"a", "b", "c"} {
		nodes[name] = servertest.Start(t, func(c *server.Config) {
			c.Database, c.Node, c.NodeHeartbeat, c.NodeTimeout = url, name, 200*time.Millisecond, time.Second
			c.MirrorCheck = 200 * time.Millisecond
		})
	}
	env := nodes["a"].Env
	nowhere := filepath.Join(t.TempDir(), "none")
	admin := storeAdmin(t, url, nowhere)
	token := aliceWrites(admin)

	// The upstream: a packwire of its own, private, read with bob's token.
	up := servertest.Start(t, nil)
	upAdmin := storeAdmin(t, "", up.Data.Dir)
	upAdmin("anonymous-read", "off")
	upAdmin("user", "add", "bob")
	upAdmin("grant", "bob", "write", "src")
	lines := strings.Split(strings.TrimSpace(upAdmin("token", "create", "bob")), "\n")
	upToken := lines[len(lines)-1]
	secret := strings.SplitN(upToken, "_", 3)[2]
	upAdmin("repo", "create", "src")
	upURL := fmt.Sprintf("http://bob:%s@%s/src", upToken, up.HTTPAddr)
	work := filepath.Join(t.TempDir(), "work")
	env.Git("", "init", "-q", "-b", "main", work)
	commit := func(msg string) string {
		os.WriteFile(filepath.Join(work, "f.txt"), []byte(msg+"\n"), 0o644)
		env.Git(work, "add", ".")
		env.Git(work, "commit", "-qm", msg)
		env.Git(work, "push", "-q", upURL, "main")
		return strings.TrimSpace(env.Git(work, "rev-parse", "main"))
	}
	first := commit("one")

	out := admin("repo", "import", "team/mirror", "http://"+up.HTTPAddr.String()+"/src", "--mirror", "--token", upToken, "--interval", "1s", "--replicas", "3")
	if strings.Contains(out, secret) {
		t.Fatalf("repo import printed the token:\n%s", out)
	}
	mainOn := func(node string) string {
		out, err := env.Run("", nil, "ls-remote", "git://"+nodes[node].GitAddr.String()+"/team/mirror", "refs/heads/main")
		if err != nil {
			return ""
		}
		id, _, _ := strings.Cut(out, "\t")
		return strings.TrimSpace(id)
	}
	waitEvery := func(what, id string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if mainOn("a") == id && mainOn("b") == id && mainOn("c") == id {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: main is %q, %q, %q; want %s\n%s", what, mainOn("a"), mainOn("b"), mainOn("c"), id, admin("cluster", "status"))
			}
		}
	}
	waitEvery("the import on every node", first)
	// Each sync the primary made is a generation of the cluster (its ref
	// transaction went through the cluster's hook): not a sync by each
	// node of its own copy, which would leave the generation as it was.
	generation := func() int64 {
		t.Helper()
		var st cluster.Status
		if err := json.Unmarshal([]byte(admin("cluster", "status", "--json")), &st); err != nil {
			t.Fatal(err)
		}
		for _, r := range st.Repos {
			if r.Name == "team/mirror" {
				return r.Generation
			}
		}
		t.Fatal("team/mirror is not in cluster status")
		return 0
	}
	imported := generation()
	copyOf := func(node string) string { return filepath.Join(nodes[node].Data.Dir, "repos", "team", "mirror.git") }
	for name := range nodes {
		// Every copy knows it is a mirror (any may become primary), and
		// keeps the token out of its config.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			cfg, _ := os.ReadFile(filepath.Join(copyOf(name), "config"))
			if strings.Contains(string(cfg), secret) {
				t.Fatalf("node %s's copy's config has the token:\n%s", name, cfg)
			}
			if strings.Contains(string(cfg), "pullMirror = origin") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s's copy's config is not a mirror's:\n%s", name, cfg)
			}
		}
		pushURL := fmt.Sprintf("http://alice:%s@%s/team/mirror", token, nodes[name].HTTPAddr)
		if out, err := env.Run(work, nil, "push", pushURL, "main:refs/heads/other"); err == nil || !strings.Contains(out, "read-only mirror") {
			t.Fatalf("a push to the mirror through node %s: %v\n%s", name, err, out)
		}
	}
	if out := admin("repo", "mirror", "list", "team/mirror"); !strings.Contains(out, "read-only mirror of http://"+up.HTTPAddr.String()+"/src (credentials stored)") || strings.Contains(out, secret) {
		t.Fatalf("repo mirror list in the cluster:\n%s", out)
	}

	// The primary's mirror endpoint is the cluster's only: a client's
	// token, even a writer's, is refused.
	clusterOnly(t, "http://"+nodes["a"].HTTPAddr.String()+route.MirrorPath, `{"action":"sync","repo":"team/mirror"}`, token)

	// On demand, from a machine with no copy: the primary syncs, and the
	// sync is replicated as a push is (every copy, at once equal).
	second := commit("two")
	out = admin("repo", "sync", "team/mirror")
	if !strings.Contains(out, "synced team/mirror") || !strings.Contains(out, "1 refs changed") {
		// The scheduled sync may have come first: then nothing changed.
		if !strings.Contains(out, "0 refs changed") {
			t.Fatalf("repo sync in the cluster:\n%s", out)
		}
	}
	if out := admin("cluster", "verify", "team/mirror", "--no-repair"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify right after the sync:\n%s", out)
	}
	waitEvery("the sync on every node", second)
	if g := generation(); g <= imported {
		t.Fatalf("the sync left the generation at %d (the import's: %d)", g, imported)
	}
	synced := generation()

	// Scheduled: the primary syncs by itself.
	third := commit("three")
	waitEvery("the scheduled sync on every node", third)
	if g := generation(); g <= synced {
		t.Fatalf("the scheduled sync left the generation at %d", g)
	}
	for name := range nodes {
		env.Git(copyOf(name), "fsck", "--strict")
	}

	// A rename keeps the mirroring.
	admin("repo", "rename", "team/mirror", "team/mirrored")
	if out := admin("repo", "mirror", "list", "team/mirrored"); !strings.Contains(out, "read-only mirror of http://"+up.HTTPAddr.String()+"/src (credentials stored)") {
		t.Fatalf("repo mirror list after a rename:\n%s", out)
	}

	// A one-off import with credentials: the primary imports with them,
	// then the database forgets them; the copies are writable.
	out = admin("repo", "import", "team/once", upURL, "--replicas", "3")
	if strings.Contains(out, secret) {
		t.Fatalf("repo import printed the token:\n%s", out)
	}
	data, err := datadir.OpenWith(context.Background(), filepath.Join(t.TempDir(), "probe"), url)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		st, err := cluster.RepoSettings(context.Background(), data.Store.DB, "team/once")
		if err == nil && st.Mirror != nil && !strings.Contains(*st.Mirror, secret) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the one-off import's credentials are still in the database (%v)", err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var st cluster.Status
		json.Unmarshal([]byte(admin("cluster", "status", "--json")), &st)
		current := 0
		for _, r := range st.Repos {
			for _, rp := range r.Replicas {
				if r.Name == "team/once" && r.Generation > 0 && rp.Generation == r.Generation {
					current++
				}
			}
		}
		if current == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the one-off import on every node")
		}
	}
	env.Git(work, "push", "-q", fmt.Sprintf("http://alice:%s@%s/team/once", token, nodes["b"].HTTPAddr), "main:refs/heads/mine")
	if out := admin("cluster", "verify", "team/once", "--wait", "15s"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify of the one-off import:\n%s", out)
	}

	// A push mirror added in the cluster gets the next push, whichever
	// node takes it.
	target := filepath.Join(t.TempDir(), "target.git")
	env.Git("", "init", "-q", "--bare", target)
	admin("repo", "create", "team/app", "--replicas", "3")
	if out := admin("repo", "mirror", "add", "team/app", target); !strings.Contains(out, "push mirror 1 of team/app added") || !strings.Contains(out, "its primary applied it") {
		t.Fatalf("repo mirror add in the cluster:\n%s", out)
	}
	for _, via := range []string{"b", "c"} {
		env.Git(work, "commit", "-q", "--allow-empty", "-m", "to "+via)
		env.Git(work, "push", "-q", fmt.Sprintf("http://alice:%s@%s/team/app", token, nodes[via].HTTPAddr), "main")
		want := strings.TrimSpace(env.Git(work, "rev-parse", "main"))
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			got, _ := env.Run(target, nil, "rev-parse", "--verify", "-q", "refs/heads/main")
			if strings.TrimSpace(got) == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the push mirror has main %q, want %s\n%s", got, want, admin("repo", "mirror", "list", "team/app"))
			}
		}
	}
	if out := admin("repo", "mirror", "list", "team/app"); !strings.Contains(out, "push mirror 1: "+target) || !strings.Contains(out, "delivered") {
		t.Fatalf("repo mirror list after the pushes:\n%s", out)
	}
	// A node that is not the primary and took a delivery has the primary
	// push: its own sender (here one with no repositories at all, which
	// would fail for good) is not used.
	var st cluster.Status
	if err := json.Unmarshal([]byte(admin("cluster", "status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	appPrimary := ""
	for _, r := range st.Repos {
		if r.Name == "team/app" {
			appPrimary = r.Primary
		}
	}
	other := map[string]string{"a": "b", "b": "c", "c": "a"}[appPrimary]
	env.Git(target, "update-ref", "refs/heads/main", "HEAD~1") // the mirror behind
	pusher := &route.MirrorPusher{Router: nodes[other].Router, Local: &mirror.Pusher{Root: repo.Root{Dir: t.TempDir()}}}
	if res := pusher.Send(context.Background(), store.Delivery{Kind: store.KindPushMirror, Target: mirror.PushTarget("team/app", 1), Repo: "team/app"}); res.Err != nil {
		t.Fatalf("a delivery taken by node %s (primary %s): %v", other, appPrimary, res.Err)
	}
	if got := env.Git(target, "rev-parse", "refs/heads/main"); got != env.Git(work, "rev-parse", "main") {
		t.Fatalf("the push mirror has main %s after the primary's push", got)
	}
	admin("repo", "mirror", "remove", "team/app", "1")
	for name := range nodes {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			cfg, _ := os.ReadFile(filepath.Join(nodes[name].Data.Dir, "repos", "team", "app.git", "config"))
			if !strings.Contains(string(cfg), "packwire-push-1") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s still has the removed push mirror:\n%s", name, cfg)
			}
		}
	}
}

// dulwich runs a Python script with dulwich, a second git implementation
// (Debian's python3-dulwich, which scripts/install-deps installs), and
// fails the test if it fails or hangs.
func dulwich(t *testing.T, script string, args ...string) string {
	t.Helper()
	const python = "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import dulwich").CombinedOutput(); err != nil {
		needs.Missing(t, "dulwich is not installed (Debian python3-dulwich; scripts/install-deps installs it): %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, append([]string{"-c", script}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dulwich: %v\n%s", err, out)
	}
	return string(out)
}

// clusterOnly checks that an endpoint nodes call each other on refuses a
// client's token (alice's, with write access) and no credentials alike,
// with 401. headers are name, value pairs.
func clusterOnly(t *testing.T, url, body, token string, headers ...string) {
	t.Helper()
	for _, user := range []string{"alice", "packwire-cluster", ""} {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		if user != "" {
			req.SetBasicAuth(user, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s as %q: %s, want 401", url, user, resp.Status)
		}
	}
}
