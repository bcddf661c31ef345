package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
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

// TestClusterPushStartsTheHookOnce: a push that git commits in one
// transaction (one ref, or an atomic push) starts the primary's
// reference-transaction hook once, for "prepared", and the primary's copy
// is still recorded at the new generation once git wrote its refs; a
// non-atomic push of several refs (a transaction per ref) is replicated
// ref by ref, with git's every call, as before.
func TestClusterPushStartsTheHookOnce(t *testing.T) {
	t.Parallel()
	url := pgtest.Shared(t).NewDatabase(t)
	var serverLog lockedBuffer
	nodes := map[string]*servertest.Server{}
	for _, name := range []string{"a", "b", "c"} {
		nodes[name] = servertest.Start(t, func(c *server.Config) {
			c.Database, c.Node, c.NodeHeartbeat, c.NodeTimeout = url, name, 200*time.Millisecond, time.Second
			c.Log = slog.New(slog.NewTextHandler(&serverLog, &slog.HandlerOptions{Level: slog.LevelDebug}))
		})
	}
	admin := storeAdmin(t, url, filepath.Join(t.TempDir(), "none"))
	admin("repo", "create", "team/app", "--replicas", "3")
	token := aliceWrites(admin)
	repoStatus := func() cluster.RepoStatus {
		t.Helper()
		var st cluster.Status
		if err := json.Unmarshal([]byte(admin("cluster", "status", "--json", "--node-timeout", "1s")), &st); err != nil {
			t.Fatal(err)
		}
		for _, r := range st.Repos {
			if r.Name == "team/app" {
				return r
			}
		}
		return cluster.RepoStatus{}
	}
	// Every copy, the primary's included, at gen.
	settled := func(gen int64) cluster.RepoStatus {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			r := repoStatus()
			ok := r.Generation == gen && len(r.Replicas) == 3
			for _, rp := range r.Replicas {
				ok = ok && rp.Generation == gen
			}
			if ok {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("not every copy at generation %d: %+v", gen, r)
			}
		}
	}
	primary := settled(0).Primary
	hookCalls := func(state string) int {
		return strings.Count(serverLog.String(), `msg="cluster: hook call" repo=team/app state=`+state)
	}

	env := nodes["a"].Env
	work := filepath.Join(t.TempDir(), "work")
	env.Git("", "init", "-q", "-b", "main", work)
	n := 0
	commit := func() {
		n++
		os.WriteFile(filepath.Join(work, "f.txt"), []byte(fmt.Sprintln(n)), 0o644)
		env.Git(work, "add", ".")
		env.Git(work, "commit", "-qm", fmt.Sprint(n))
	}
	pushURL := fmt.Sprintf("http://alice:%s@%s/team/app", token, nodes[primary].HTTPAddr)
	commit()
	env.Git(work, "push", "-q", pushURL, "main")
	settled(1)
	commit()
	env.Git(work, "push", "-q", "--atomic", pushURL, "main", "main:refs/heads/other")
	settled(2)
	if p, c := hookCalls("prepared"), hookCalls("committed"); p != 2 || c != 0 {
		t.Fatalf("two one-transaction pushes: %d prepared and %d committed calls of the hook, want 2 and 0", p, c)
	}
	// Non-atomic, two refs: two transactions, each replicated.
	commit()
	env.Git(work, "push", "-q", pushURL, "main", "main:refs/heads/third")
	settled(4)
	if p, c := hookCalls("prepared"), hookCalls("committed"); p != 4 || c != 2 {
		t.Fatalf("after a non-atomic push of two refs: %d prepared and %d committed calls, want 4 and 2", p, c)
	}
	want := env.RevParse(work, "HEAD")
	for name, node := range nodes {
		bare := filepath.Join(node.Config.DataDir, "repos", "team", "app.git")
		for _, ref := range []string{"refs/heads/main", "refs/heads/other", "refs/heads/third"} {
			got, _ := env.Run(bare, nil, "rev-parse", "-q", "--verify", ref)
			if ref != "refs/heads/other" && strings.TrimSpace(got) != want {
				t.Errorf("node %s: %s at %q, want %s", name, ref, strings.TrimSpace(got), want)
			}
		}
	}
}
