package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/gittest"
	"packwire/internal/store"
)

// actor is a client identity: a user with a token and an SSH key, or
// anonymous (name "").
type actor struct {
	name  string
	token string
	key   string // private key file
}

var anon = &actor{}

// accessServer is a server with every transport on and no grants: each
// test sets the model it exercises.
type accessServer struct {
	*testServer
	alice *actor
}

func startAccessServer(t *testing.T) *accessServer {
	t.Helper()
	return startAccessServerWith(t, nil)
}

// startAccessServerWith is startAccessServer with mutate applied to the
// configuration too.
func startAccessServerWith(t *testing.T, mutate func(*Config)) *accessServer {
	t.Helper()
	s := startServer(t, func(c *Config) {
		c.SSHAddr = "127.0.0.1:0"
		if mutate != nil {
			mutate(c)
		}
	})
	ctx := context.Background()
	if err := s.Data.Store.RemoveGrant(ctx, "alice", "**"); err != nil {
		t.Fatal(err)
	}
	a := &accessServer{testServer: s}
	a.alice = &actor{name: "alice", token: s.token, key: a.addKey(t, "alice")}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", lastLines(s.logs.String(), 60))
		}
	})
	return a
}

func (a *accessServer) addKey(t *testing.T, user string) string {
	t.Helper()
	key := a.env.NewSSHKey(fmt.Sprintf("%s_%d", user, time.Now().UnixNano()))
	text, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, err := gossh.ParseAuthorizedKey(text)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Data.Store.AddKey(context.Background(), user, store.Key{Fingerprint: gossh.FingerprintSHA256(pub), PublicKey: string(gossh.MarshalAuthorizedKey(pub))}); err != nil {
		t.Fatal(err)
	}
	return key
}

// addUser registers a user with a token and a key.
func (a *accessServer) addUser(t *testing.T, name string) *actor {
	t.Helper()
	ctx := context.Background()
	if _, err := a.Data.Store.AddUser(ctx, name); err != nil {
		t.Fatal(err)
	}
	token, err := a.Data.Access.CreateToken(ctx, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return &actor{name: name, token: token, key: a.addKey(t, name)}
}

func (a *accessServer) grant(t *testing.T, user, role, pattern string) {
	t.Helper()
	if err := a.Data.Store.SetGrant(context.Background(), store.Grant{User: user, Role: role, RepoPattern: pattern}); err != nil {
		t.Fatal(err)
	}
}

func (a *accessServer) rule(t *testing.T, allow bool, ops, repo, ref, who string) {
	t.Helper()
	if _, err := a.Data.Store.InsertRules(context.Background(), 0, store.Rule{Allow: allow, Ops: ops, RepoPattern: repo, RefPattern: ref, Who: who}); err != nil {
		t.Fatal(err)
	}
}

// protect is what "packwire protect" does.
func (a *accessServer) protect(t *testing.T, repo, ref string) {
	t.Helper()
	_, err := a.Data.Store.InsertRules(context.Background(), 1,
		store.Rule{Allow: true, Ops: "force-push,delete", RepoPattern: repo, RefPattern: ref, Who: "role:admin"},
		store.Rule{Allow: false, Ops: "force-push,delete", RepoPattern: repo, RefPattern: ref, Who: "*"})
	if err != nil {
		t.Fatal(err)
	}
}

// remote is the URL and environment with which who reaches repo over transport.
func (a *accessServer) remote(transport string, who *actor, repo string) (string, []string) {
	switch transport {
	case "git":
		return a.gitURL(repo), nil
	case "http":
		if who.name == "" {
			return a.httpURL(repo), nil
		}
		return fmt.Sprintf("http://%s:%s@%s/%s", who.name, who.token, a.HTTPAddr, repo), nil
	case "ssh":
		_, port, _ := strings.Cut(a.SSHAddr.String(), ":")
		return fmt.Sprintf("ssh://git@127.0.0.1:%s/%s", port, repo), []string{gittest.SSHCommandEnv(who.key)}
	}
	panic(transport)
}

// git runs a git command whose "URL" argument is replaced by who's remote
// URL for repo; it fails the test if the command takes over five minutes
// (a hang). The bound is loose on purpose: on a 2-CPU machine under a load
// of 15, the client's own send-pack of TestLargeMirrorPush's 3,000 refs
// (CPU-bound, starved) took over a minute before it sent a byte.
func (a *accessServer) git(t *testing.T, dir, transport string, who *actor, repo string, args ...string) (string, error) {
	t.Helper()
	url, env := a.remote(transport, who, repo)
	args = append([]string(nil), args...)
	for i, arg := range args {
		if arg == "URL" {
			args[i] = url
		}
	}
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := a.env.Run(dir, env, args...)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-time.After(5 * time.Minute):
		t.Fatalf("git %s over %s hung", strings.Join(args, " "), transport)
		return "", nil
	}
}

// work makes a local clone of a server repository (straight from disk) to
// push from.
func (a *accessServer) work(t *testing.T, bare string) string {
	t.Helper()
	w := filepath.Join(t.TempDir(), "w")
	a.env.Git("", "clone", "-q", bare, w)
	return w
}

func (a *accessServer) commit(w, msg string) string {
	os.WriteFile(filepath.Join(w, "f.txt"), []byte(msg+"\n"), 0o644)
	a.env.Git(w, "add", ".")
	a.env.Git(w, "commit", "-qm", msg)
	return a.env.RevParse(w, "HEAD")
}

func refOf(a *accessServer, bare, ref string) string {
	out, err := a.env.Run(bare, nil, "rev-parse", "--verify", "-q", ref)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

var pushTransports = []string{"http", "ssh"}

// TestAccessRead: read access by role, anonymous read globally and per
// pattern, on every transport; no access looks exactly like no repository.
func TestAccessRead(t *testing.T) {
	t.Parallel()
	s := startAccessServer(t)
	ctx := context.Background()
	s.seed(t, "team/app")
	s.seed(t, "pub/lib")
	s.seed(t, "priv/x")
	bob := s.addUser(t, "bob")
	s.grant(t, "alice", "read", "team/*")
	s.grant(t, "bob", "admin", "priv/x")
	if err := s.Data.Store.SetSetting(ctx, "anonymous-read", "off"); err != nil {
		t.Fatal(err)
	}
	if err := s.Data.Store.SetAnonRead(ctx, store.AnonRead{RepoPattern: "pub/**", Enabled: true}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cases := []struct {
		who  *actor
		repo string
		ok   bool
	}{
		{anon, "pub/lib", true}, {anon, "team/app", false}, {anon, "priv/x", false},
		{s.alice, "team/app", true}, {s.alice, "pub/lib", true}, {s.alice, "priv/x", false},
		{bob, "priv/x", true}, {bob, "team/app", false}, {bob, "pub/lib", true},
	}
	for _, transport := range []string{"git", "http", "ssh"} {
		for _, c := range cases {
			if transport == "git" && c.who != anon {
				continue // git:// has no authentication
			}
			name := fmt.Sprintf("%s/%s/%s", transport, c.who.name, c.repo)
			out, err := s.git(t, dir, transport, c.who, c.repo, "ls-remote", "URL")
			if c.ok {
				if err != nil || !strings.Contains(out, "refs/heads/main") {
					t.Errorf("%s: want access: %v\n%s", name, err, out)
				}
				continue
			}
			if err == nil {
				t.Errorf("%s: read without access:\n%s", name, out)
				continue
			}
			// Same answer as for a repository that does not exist.
			missing := strings.Replace(c.repo, "/", "/missing-", 1)
			out2, _ := s.git(t, dir, transport, c.who, missing, "ls-remote", "URL")
			if sortedLines(strings.ReplaceAll(out2, missing, c.repo)) != sortedLines(out) {
				t.Errorf("%s: refusal differs from a missing repository's:\n%s\n--- missing:\n%s", name, out, out2)
			}
			switch {
			case transport == "http" && c.who == anon:
				if !strings.Contains(out, "could not read Username") {
					t.Errorf("%s: anonymous HTTP should be asked for credentials (401):\n%s", name, out)
				}
			case !strings.Contains(out, "not found"):
				t.Errorf("%s: want not found:\n%s", name, out)
			}
		}
	}
	// The switch applies at once, without a restart.
	if err := s.Data.Store.SetSetting(ctx, "anonymous-read", "on"); err != nil {
		t.Fatal(err)
	}
	for _, transport := range []string{"git", "http", "ssh"} {
		if out, err := s.git(t, dir, transport, anon, "team/app", "ls-remote", "URL"); err != nil {
			t.Errorf("%s: anonymous read after switching on: %v\n%s", transport, err, out)
		}
	}
	// A per-pattern override beats the server-wide switch.
	if err := s.Data.Store.SetAnonRead(ctx, store.AnonRead{RepoPattern: "priv/*", Enabled: false}); err != nil {
		t.Fatal(err)
	}
	for _, transport := range []string{"git", "http", "ssh"} {
		if out, err := s.git(t, dir, transport, anon, "priv/x", "ls-remote", "URL"); err == nil {
			t.Errorf("%s: anonymous read of priv/x despite its override:\n%s", transport, out)
		}
	}
}

// TestAccessWrite: pushing needs the write role, on exact and pattern grants.
func TestAccessWrite(t *testing.T) {
	t.Parallel()
	for _, transport := range pushTransports {
		t.Run(transport, func(t *testing.T) {
			s := startAccessServer(t)
			bare := s.seed(t, "team/app")
			other := s.seed(t, "team/other")
			admin := s.addUser(t, "carol")
			s.grant(t, "alice", "read", "team/app")
			s.grant(t, "carol", "admin", "team/*")
			w := s.work(t, bare)
			c1 := s.commit(w, "one")
			out, err := s.git(t, w, transport, s.alice, "team/app", "push", "URL", "HEAD:refs/heads/main")
			if err == nil || !strings.Contains(out, "permission denied: alice may not write 'team/app'") {
				t.Fatalf("read role pushed: %v\n%s", err, out)
			}
			if refOf(s, bare, "main") == c1 {
				t.Fatal("refused push was written")
			}
			out, err = s.git(t, w, transport, anon, "team/app", "push", "URL", "HEAD:refs/heads/main")
			if err == nil {
				t.Fatalf("anonymous push accepted:\n%s", out)
			}
			s.grant(t, "alice", "write", "team/app")
			if out, err := s.git(t, w, transport, s.alice, "team/app", "push", "URL", "HEAD:refs/heads/main"); err != nil {
				t.Fatalf("write role push: %v\n%s", err, out)
			}
			if refOf(s, bare, "main") != c1 {
				t.Fatal("push not written")
			}
			// Every protocol version the client may ask for (receive-pack
			// speaks v0 or v1; a v2 request falls back).
			for _, v := range []string{"0", "1", "2"} {
				s.commit(w, "v"+v)
				if out, err := s.git(t, w, transport, s.alice, "team/app", "-c", "protocol.version="+v, "push", "URL", "HEAD:refs/heads/v"+v); err != nil {
					t.Fatalf("push with protocol.version=%s: %v\n%s", v, err, out)
				}
				if refOf(s, bare, "refs/heads/v"+v) != s.env.RevParse(w, "HEAD") {
					t.Fatalf("protocol.version=%s push not written", v)
				}
			}
			// The exact grant does not reach team/other (which anyone may
			// read); the pattern grant does.
			if out, err := s.git(t, w, transport, s.alice, "team/other", "push", "URL", "HEAD:refs/heads/x"); err == nil || !strings.Contains(out, "permission denied: alice may not write 'team/other'") {
				t.Fatalf("push without a grant: %v\n%s", err, out)
			}
			if out, err := s.git(t, w, transport, admin, "team/other", "push", "URL", "HEAD:refs/heads/x"); err != nil {
				t.Fatalf("admin pattern push: %v\n%s", err, out)
			}
			if refOf(s, other, "refs/heads/x") != s.env.RevParse(w, "HEAD") {
				t.Fatal("admin push not written")
			}
			s.env.Fsck(bare)
		})
	}
}

// TestRefRules: create, push, force-push and delete, allowed and denied by
// rules in order, protect, and the admin exception.
func TestRefRules(t *testing.T) {
	t.Parallel()
	for _, transport := range pushTransports {
		t.Run(transport, func(t *testing.T) {
			s := startAccessServer(t)
			bare := s.seed(t, "team/app")
			carol := s.addUser(t, "carol")
			s.grant(t, "alice", "write", "team/*")
			s.grant(t, "carol", "admin", "**")
			s.rule(t, true, "create", "team/app", "refs/tags/**", "carol")
			s.rule(t, false, "create", "team/app", "refs/tags/**", "*")
			s.rule(t, false, "delete", "team/*", "refs/heads/keep/*", "*")
			s.rule(t, false, "push", "team/app", "refs/heads/frozen", "alice")
			s.protect(t, "team/app", "refs/heads/main")
			if !s.Data.Access.IsServerAdmin(context.Background(), carolPrincipal(carol)) || s.Data.Access.IsServerAdmin(context.Background(), carolPrincipal(s.alice)) {
				t.Fatal("IsServerAdmin wrong")
			}

			w := s.work(t, bare)
			mainBefore := refOf(s, bare, "main")
			push := func(who *actor, args ...string) (string, error) {
				return s.git(t, w, transport, who, "team/app", append([]string{"push", "URL"}, args...)...)
			}
			mustPush := func(who *actor, args ...string) {
				t.Helper()
				if out, err := push(who, args...); err != nil {
					t.Fatalf("%s push %v: %v\n%s", who.name, args, err, out)
				}
			}
			mustRefuse := func(want string, who *actor, args ...string) {
				t.Helper()
				out, err := push(who, args...)
				if err == nil || !strings.Contains(out, want) {
					t.Fatalf("%s push %v: want %q: %v\n%s", who.name, args, want, err, out)
				}
			}

			mustPush(s.alice, "main:refs/heads/keep/a", "main:refs/heads/frozen", "main:refs/heads/feature")
			mustRefuse("[remote rejected] main -> v9 (protected: create denied)", s.alice, "main:refs/tags/v9")
			mustPush(carol, "main:refs/tags/v9")

			c1 := s.commit(w, "ff")
			mustPush(s.alice, "HEAD:refs/heads/main") // fast-forward is allowed
			if refOf(s, bare, "main") != c1 {
				t.Fatal("fast-forward not written")
			}
			s.env.Git(w, "reset", "-q", "--hard", mainBefore)
			c2 := s.commit(w, "rewrite")
			mustRefuse("[remote rejected] HEAD -> main (protected: force-push denied)", s.alice, "--force", "HEAD:refs/heads/main")
			if refOf(s, bare, "main") != c1 {
				t.Fatal("refused force push moved main")
			}
			mustRefuse("[remote rejected] main (protected: delete denied)", s.alice, ":refs/heads/main")
			mustPush(carol, "--force", "HEAD:refs/heads/main") // admin may still force
			if refOf(s, bare, "main") != c2 {
				t.Fatal("admin force push not written")
			}
			mustRefuse("(protected: push denied)", s.alice, "HEAD:refs/heads/frozen")
			mustRefuse("(protected: delete denied)", s.alice, ":refs/heads/keep/a")
			mustPush(s.alice, "--force", "HEAD:refs/heads/feature") // no rule: write role forces
			mustPush(s.alice, ":refs/heads/feature")
			if refOf(s, bare, "refs/heads/feature") != "" || refOf(s, bare, "refs/heads/keep/a") == "" {
				t.Fatal("refs wrong after deletes")
			}
			s.env.Fsck(bare)
			logs := s.logs.String()
			for _, want := range []string{`msg="ref refused"`, `rule="deny force-push,delete team/app refs/heads/main *"`, "rule_index=2", "op=force-push", "user=alice"} {
				if !strings.Contains(logs, want) {
					t.Errorf("log lacks %q", want)
				}
			}
		})
	}
}

// TestMixedPush: a non-atomic push writes its allowed refs and reports the
// refused ones; an atomic one writes nothing; an all-refused push with a
// pack does not hang; a force-allowed forced ref is written in the same
// push that refuses a force-denied one.
func TestMixedPush(t *testing.T) {
	t.Parallel()
	for _, transport := range pushTransports {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			s := startAccessServer(t)
			bare := s.seed(t, "team/app")
			s.grant(t, "alice", "write", "**")
			s.protect(t, "**", "refs/heads/main")
			s.rule(t, false, "create", "**", "refs/tags/**", "*")
			w := s.work(t, bare)
			mainBefore := refOf(s, bare, "main")
			s.env.Git(w, "reset", "-q", "--hard", "HEAD~1")
			forced := s.commit(w, "rewrite")
			s.env.Git(w, "tag", "t1")

			// Non-atomic: feature is written, main and the tag are refused.
			out, err := s.git(t, w, transport, s.alice, "team/app", "push", "--force", "URL", "HEAD:refs/heads/main", "HEAD:refs/heads/feature", "refs/tags/t1")
			if err == nil {
				t.Fatalf("mixed push reported success:\n%s", out)
			}
			for _, want := range []string{"HEAD -> feature", "(protected: force-push denied)", "(protected: create denied)"} {
				if !strings.Contains(out, want) {
					t.Errorf("mixed push output lacks %q:\n%s", want, out)
				}
			}
			if refOf(s, bare, "refs/heads/feature") != forced || refOf(s, bare, "main") != mainBefore || refOf(s, bare, "refs/tags/t1") != "" {
				t.Fatalf("mixed push: wrong refs on the server:\n%s", s.env.Git(bare, "show-ref"))
			}
			s.env.Fsck(bare)

			// Atomic: nothing is written.
			s.commit(w, "more")
			out, err = s.git(t, w, transport, s.alice, "team/app", "push", "--atomic", "URL", "HEAD:refs/heads/feature", "HEAD:refs/heads/other", "refs/tags/t1")
			if err == nil || !strings.Contains(out, "(protected: create denied)") || !strings.Contains(out, "atomic") {
				t.Fatalf("atomic mixed push: %v\n%s", err, out)
			}
			if refOf(s, bare, "refs/heads/feature") != forced || refOf(s, bare, "refs/heads/other") != "" {
				t.Fatal("atomic push wrote refs")
			}

			// Every ref refused, with a pack to send: must not hang.
			start := time.Now()
			out, err = s.git(t, w, transport, s.alice, "team/app", "push", "URL", "refs/tags/t1", "HEAD:refs/tags/t2")
			if err == nil || strings.Count(out, "protected: create denied") != 2 {
				t.Fatalf("all-refused push: %v\n%s", err, out)
			}
			// A hang lasts the idle timeout (10 min); 2 min is a loaded machine.
			if d := time.Since(start); d > 2*time.Minute {
				t.Fatalf("all-refused push took %v", d)
			}

			// Force-allowed (feature) and force-denied (main) updates in one
			// push: feature is forced, main is refused with its reason.
			s.env.Git(w, "reset", "-q", "--hard", mainBefore+"~1")
			rewritten := s.commit(w, "another rewrite")
			out, err = s.git(t, w, transport, s.alice, "team/app", "push", "--force", "URL", "HEAD:refs/heads/main", "HEAD:refs/heads/feature")
			if err == nil || !strings.Contains(out, "HEAD -> main (protected: force-push denied)") || !strings.Contains(out, "HEAD -> feature (forced update)") {
				t.Fatalf("mixed force push: %v\n%s", err, out)
			}
			if refOf(s, bare, "refs/heads/feature") != rewritten || refOf(s, bare, "main") != mainBefore {
				t.Fatalf("mixed force push: wrong refs on the server:\n%s", s.env.Git(bare, "show-ref"))
			}
			s.env.Fsck(bare)
		})
	}
}

func carolPrincipal(a *actor) accessPrincipal { return accessPrincipal{User: a.name, Via: "token"} }

// sortedLines compares outputs whose lines come from two streams (SSH
// stderr and the ERR packet) in either order.
func sortedLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
