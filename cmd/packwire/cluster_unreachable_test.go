package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/pgtest"
	"packwire/internal/server"
	"packwire/internal/servertest"
)

// unavailableWording is what a client is told when the node cannot reach
// its store.
const unavailableWording = "temporarily unavailable"

// expectUnavailable checks that node answers within 5 s on every
// transport that it is temporarily unavailable: HTTP 503 with
// Retry-After, an ERR over git://, stderr and a failed exit over SSH (a
// registered key, whose owner cannot be looked up).
func expectUnavailable(t *testing.T, n *servertest.Server, repoName, token, sshKey string) {
	t.Helper()
	const within = 5 * time.Second
	began := time.Now()
	client := &http.Client{Timeout: 15 * time.Second}
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://%s/%s/info/refs?service=git-upload-pack", n.HTTPAddr, repoName), nil)
	req.SetBasicAuth("alice", token)
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("HTTP with the store unreachable: %v after %s", err, time.Since(began))
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if took := time.Since(began); res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(body), unavailableWording) || took > within {
		t.Errorf("HTTP with the store unreachable: %s, Retry-After %q, %q after %s; want 503, Retry-After, %q within %s",
			res.Status, res.Header.Get("Retry-After"), body, took, unavailableWording, within)
	} else {
		t.Logf("with the store unreachable, HTTP answered %s in %s", res.Status, took.Round(time.Millisecond))
	}
	// Anonymous (git sends no credentials before a 401) too.
	began = time.Now()
	out, took, err := timedGit(n.Env, nil, "ls-remote", n.HTTPURL(repoName))
	if err == nil || !strings.Contains(out, "503") || took > within {
		t.Errorf("git ls-remote over HTTP with the store unreachable: %v after %s\n%s", err, took, out)
	}
	out, took, err = timedGit(n.Env, nil, "ls-remote", n.GitURL(repoName))
	if err == nil || !strings.Contains(out, "remote error: service "+unavailableWording) || took > within {
		t.Errorf("git ls-remote over git:// with the store unreachable: %v after %s\n%s", err, took, out)
	}
	out, took, err = timedGit(n.Env, []string{gittest.SSHCommandEnv(sshKey)}, "ls-remote", n.SSHURL(repoName))
	if err == nil || !strings.Contains(out, unavailableWording) || took > within {
		t.Errorf("git ls-remote over SSH with the store unreachable: %v after %s\n%s", err, took, out)
	}
	t.Logf("with the store unreachable, SSH answered in %s", took.Round(time.Millisecond))
}

// expectServed waits (up to 30 s) until node serves repoName on every
// transport again.
func expectServed(t *testing.T, n *servertest.Server, repoName, sshKey string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range []struct {
		url string
		env []string
	}{{n.HTTPURL(repoName), nil}, {n.GitURL(repoName), nil}, {n.SSHURL(repoName), []string{gittest.SSHCommandEnv(sshKey)}}} {
		for {
			out, _, err := timedGit(n.Env, c.env, "ls-remote", c.url)
			if err == nil && strings.Contains(out, "refs/heads/main") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not served again once the store is back: %v\n%s", c.url, err, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// timedGit runs git with env's variables, given up after 15 s, and says
// how long it took.
func timedGit(env *gittest.Env, extra []string, args ...string) (string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = append(append([]string{}, env.Vars...), extra...)
	began := time.Now()
	out, err := cmd.CombinedOutput()
	return string(out), time.Since(began), err
}

// unreachableCluster starts nodes a and b on pg's database, a through
// dial (nil: directly), places team/app on both with one push, and
// gives alice a token and a registered SSH key.
func unreachableCluster(t *testing.T, pg *pgtest.Server, through func(dbURL string) string) (nodes map[string]*servertest.Server, token, key string) {
	t.Helper()
	dbURL := pg.NewDatabase(t)
	const heartbeat, timeout = 200 * time.Millisecond, time.Second
	nodes = map[string]*servertest.Server{}
	for _, name := range []string{"a", "b"} {
		nodes[name] = servertest.Start(t, func(c *server.Config) {
			c.Database, c.Node, c.NodeHeartbeat, c.NodeTimeout = dbURL, name, heartbeat, timeout
			if name == "a" && through != nil {
				c.Database = through(dbURL)
			}
		})
	}
	admin := storeAdmin(t, dbURL, t.TempDir()+"/none")
	admin("repo", "create", "team/app", "--replicas", "2")
	token = aliceWrites(admin)
	env := nodes["b"].Env
	key = env.NewSSHKey("alice")
	admin("key", "add", "alice", key+".pub")
	work := t.TempDir() + "/work"
	env.Git("", "init", "-q", "-b", "main", work)
	env.Git(work, "commit", "-q", "--allow-empty", "-m", "one")
	// Pushed again until both copies are made and the primary takes it.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, err := env.Run(work, nil, "push", "-q", fmt.Sprintf("http://alice:%s@%s/team/app", token, nodes["b"].HTTPAddr), "main")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("first push: %v\n%s", err, out)
		}
	}
	for _, n := range nodes {
		n.Env = env // one client environment: alice's key is in its HOME
	}
	return nodes, token, key
}

// TestClusterStoreDownIsUnavailable: with PostgreSQL stopped, a node
// answers every client at once that it is temporarily unavailable, in
// each transport's words (HTTP 503 with Retry-After, an ERR over git://,
// stderr and a failed exit over SSH), not "internal error checking
// access" (HTTP 500) or an SSH login refused; once PostgreSQL is back it
// serves again.
func TestClusterStoreDownIsUnavailable(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	pg := pgtest.Start(t)
	nodes, token, key := unreachableCluster(t, pg, nil)
	pg.Halt()
	expectUnavailable(t, nodes["a"], "team/app", token, key)
	if err := pg.Resume(); err != nil {
		t.Fatal(err)
	}
	expectServed(t, nodes["a"], "team/app", key)
}

// TestClusterNodeCutOffFromStore: one node's PostgreSQL connections
// blackholed (no byte moves, nothing closed): every request to that node
// is answered within 5 s that it is temporarily unavailable, on every
// transport, rather than held for the whole cut; once the cut ends it
// serves again.
func TestClusterNodeCutOffFromStore(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	pg := pgtest.Shared(t) // cut off through a proxy: PostgreSQL itself stays up
	var hole *testProxy
	nodes, token, key := unreachableCluster(t, pg, func(dbURL string) string {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		hole = newTestProxy(t, u.Host)
		u.Host = hole.addr()
		return u.String()
	})
	hole.cut()
	defer hole.mend() // on failure too: the nodes stop before the proxy does
	expectUnavailable(t, nodes["a"], "team/app", token, key)
	hole.mend()
	expectServed(t, nodes["a"], "team/app", key)
}
