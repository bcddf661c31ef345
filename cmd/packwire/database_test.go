package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/pgtest"
	"packwire/internal/server"
	"packwire/internal/servertest"
)

// TestSharedPostgresStore: two servers with their own data directories
// and one PostgreSQL store. Admin commands run with --database only (no
// data directory on this "machine") change both at once: a user, grant
// and token created once authenticate on either server, anonymous read
// turned off applies to both, and the audit log holds it all.
func TestSharedPostgresStore(t *testing.T) {
	t.Parallel()
	url := pgtest.Shared(t).NewDatabase(t)
	servers := []*servertest.Server{
		servertest.Start(t, func(c *server.Config) { c.Database = url }),
		servertest.Start(t, func(c *server.Config) { c.Database = url }),
	}
	for _, s := range servers {
		s.Repo(t, "team/app", gittest.Shape{Commits: 3, Branches: 1})
	}
	nowhere := filepath.Join(t.TempDir(), "no-data-here")
	admin := storeAdmin(t, url, nowhere)
	admin("user", "add", "alice")
	admin("grant", "alice", "write", "team/*")
	admin("anonymous-read", "off")
	out := admin("token", "create", "alice")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	token := lines[len(lines)-1]
	if _, err := os.Stat(nowhere); !os.IsNotExist(err) {
		t.Fatalf("an admin command on a PostgreSQL store created the data directory: %v", err)
	}

	env := servers[0].Env
	for i, s := range servers {
		anon := fmt.Sprintf("http://%s/team/app", s.HTTPAddr)
		if out, err := env.Run("", nil, "ls-remote", anon); err == nil {
			t.Fatalf("server %d: anonymous ls-remote succeeded with anonymous read off:\n%s", i, out)
		}
		authed := fmt.Sprintf("http://alice:%s@%s/team/app", token, s.HTTPAddr)
		dir := filepath.Join(t.TempDir(), "clone")
		out, err := env.Run("", []string{"GIT_TRACE_PACKET=1"}, "clone", authed, dir)
		if err != nil {
			t.Fatalf("server %d: clone with the shared token: %v\n%s", i, err, out)
		}
		if !strings.Contains(out, "git< version 2") {
			t.Errorf("server %d: the clone did not speak protocol v2", i)
		}
		os.WriteFile(filepath.Join(dir, "new.txt"), []byte(fmt.Sprintf("from %d\n", i)), 0o644)
		env.Git(dir, "add", ".")
		env.Git(dir, "commit", "-qm", "shared store push")
		env.Git(dir, "push", "-q", "origin", "HEAD:refs/heads/pushed")
		bare := filepath.Join(s.Data.Dir, "repos", "team", "app.git")
		if got, want := env.RevParse(bare, "refs/heads/pushed"), env.RevParse(dir, "HEAD"); got != want {
			t.Fatalf("server %d: pushed %s, repository has %s", i, want, got)
		}
		env.Git(bare, "fsck", "--strict")
	}
	// The audit log, read from the database, holds the commands' changes.
	out = admin("audit", "--limit", "0")
	for _, want := range []string{"user add", "grant", "setting", "token create"} {
		if !strings.Contains(out, want) {
			t.Errorf("audit lacks %q:\n%s", want, out)
		}
	}
	// A --database that is not PostgreSQL is refused with a clear message.
	out, code := packwire(t, "user", "list", "--database", "mysql://x/y", "--data", nowhere)
	if code == 0 || !strings.Contains(out, "not a postgres:// URL") {
		t.Fatalf("--database mysql://: %d %s", code, out)
	}
}

// storeAdmin runs admin commands against a PostgreSQL store from a
// "machine" with no data directory (one that does not exist and must not
// be created), failing the test on a non-zero exit.
func storeAdmin(t *testing.T, database, nowhere string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, code := packwire(t, append(args, "--data", nowhere, "--database", database)...)
		if code != 0 {
			t.Fatalf("packwire %s: %d\n%s", strings.Join(args, " "), code, out)
		}
		return out
	}
}

// startNodes starts a node of the cluster on database url per name, with
// heartbeat and timeout; more (nil: none) adjusts each node's config.
func startNodes(t *testing.T, url string, names []string, heartbeat, timeout time.Duration, more func(*server.Config)) map[string]*servertest.Server {
	nodes := map[string]*servertest.Server{}
	for _, name := range names {
		nodes[name] = servertest.Start(t, func(c *server.Config) {
			c.Database, c.Node, c.NodeHeartbeat, c.NodeTimeout = url, name, heartbeat, timeout
			if more != nil {
				more(c)
			}
		})
	}
	return nodes
}

// aliceWrites adds user alice with write access to team/* through admin
// (storeAdmin) and returns a new token of hers.
func aliceWrites(admin func(args ...string) string) (token string) {
	admin("user", "add", "alice")
	admin("grant", "alice", "write", "team/*")
	lines := strings.Split(strings.TrimSpace(admin("token", "create", "alice")), "\n")
	return lines[len(lines)-1]
}
