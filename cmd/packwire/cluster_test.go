package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/pgtest"
	"packwire/internal/server"
	"packwire/internal/server/cluster"
	"packwire/internal/servertest"
)

// TestClusterReplicatesAndFailsOver: three nodes on one PostgreSQL. A
// repository created with the CLI appears on all three; a push to its
// primary is on every replica (fsck-clean) before git's report reaches
// the client; a push to another node is refused naming the primary; any
// node serves a clone; when the primary's node stops, an up-to-date
// replica is promoted within 10 s and takes pushes (2 of 3 is a
// majority); the stopped node, started again, catches up before it serves.
func TestClusterReplicatesAndFailsOver(t *testing.T) {
	url := pgtest.Start(t).NewDatabase(t)
	const heartbeat, timeout = 200 * time.Millisecond, time.Second
	dirs := map[string]string{}
	start := func(name string) *servertest.Server {
		return servertest.Start(t, func(c *server.Config) {
			c.Database, c.Node, c.NodeHeartbeat, c.NodeTimeout = url, name, heartbeat, timeout
			if d, ok := dirs[name]; ok {
				c.DataDir = d
			}
			dirs[name] = c.DataDir
		})
	}
	nodes := map[string]*servertest.Server{"a": start("a"), "b": start("b"), "c": start("c")}
	env := nodes["a"].Env
	admin := func(args ...string) string {
		t.Helper()
		out, code := packwire(t, append(args, "--database", url, "--data", filepath.Join(t.TempDir(), "none"))...)
		if code != 0 {
			t.Fatalf("packwire %s: %d\n%s", strings.Join(args, " "), code, out)
		}
		return out
	}
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

	out := admin("repo", "create", "team/app")
	if !strings.Contains(out, "placed team/app on a, b, c") {
		t.Fatalf("repo create in a cluster:\n%s", out)
	}
	st := waitFor("every copy created", 10*time.Second, allAt(0, "a", "b", "c"))
	primary := repoOf(st).Primary
	admin("user", "add", "alice")
	admin("grant", "alice", "write", "team/*")
	lines := strings.Split(strings.TrimSpace(admin("token", "create", "alice")), "\n")
	token := lines[len(lines)-1]
	pushURL := func(n *servertest.Server) string {
		return fmt.Sprintf("http://alice:%s@%s/team/app", token, n.HTTPAddr)
	}
	bare := func(name string) string { return filepath.Join(dirs[name], "repos", "team", "app.git") }

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
	for name := range nodes {
		if got := env.RevParse(bare(name), "refs/heads/main"); got != first {
			t.Fatalf("node %s has main at %s right after the push, want %s", name, got, first)
		}
		env.Git(bare(name), "fsck", "--strict")
	}
	waitFor("generation 1 everywhere", 5*time.Second, allAt(1, "a", "b", "c"))

	// Another node refuses a push, naming the primary.
	var other string
	for name := range nodes {
		if name != primary {
			other = name
			break
		}
	}
	second := commit("two")
	out, err := env.Run(work, nil, "push", pushURL(nodes[other]), "main")
	if err == nil || !strings.Contains(out, "takes pushes on node "+primary) {
		t.Fatalf("push to non-primary %s: %v\n%s", other, err, out)
	}
	// Any node serves a clone, over protocol v2.
	clone := filepath.Join(t.TempDir(), "clone")
	out, err = env.Run("", []string{"GIT_TRACE_PACKET=1"}, "clone", nodes[other].GitURL("team/app"), clone)
	if err != nil || !strings.Contains(out, "clone< version 2") {
		t.Fatalf("clone from %s: %v\n%s", other, err, out)
	}
	if got := env.RevParse(clone, "HEAD"); got != first {
		t.Fatalf("clone from %s at %s, want %s", other, got, first)
	}

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
	for name := range nodes {
		if name != primary {
			survivors = append(survivors, name)
			if got := env.RevParse(bare(name), "refs/heads/main"); got != second {
				t.Fatalf("node %s has main at %s after the failover push, want %s", name, got, second)
			}
		}
	}
	waitFor("generation 2 on the survivors", 5*time.Second, allAt(2, survivors...))

	// The old primary comes back behind, and catches up before serving.
	nodes[primary] = start(primary)
	waitFor("the old primary caught up", 10*time.Second, allAt(2, "a", "b", "c"))
	if got := env.RevParse(bare(primary), "refs/heads/main"); got != second {
		t.Fatalf("restarted %s has main at %s, want %s", primary, got, second)
	}
	env.Git(bare(primary), "fsck", "--strict")
	text := admin("cluster", "status")
	if !strings.Contains(text, "team/app") || !strings.Contains(text, newPrimary) {
		t.Fatalf("cluster status:\n%s", text)
	}
}
