package server

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/gittest"
)

// TestTokenCredentials: wrong, tampered, expired, revoked tokens, a token
// presented under another user's name, and tokens and keys of removed users.
func TestTokenCredentials(t *testing.T) {
	t.Parallel()
	s := startAccessServer(t)
	ctx := context.Background()
	bare := s.seed(t, "team/app")
	s.grant(t, "alice", "write", "**")
	bob := s.addUser(t, "bob")
	s.grant(t, "bob", "write", "**")
	w := s.work(t, bare)
	s.commit(w, "x")
	before := s.env.Git(bare, "show-ref")

	expired, err := s.Data.Access.CreateToken(ctx, "alice", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := s.Data.Access.CreateToken(ctx, "alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.Split(revoked, "_")[1]
	if err := s.Data.Store.RevokeToken(ctx, id); err != nil {
		t.Fatal(err)
	}
	last := s.alice.token[len(s.alice.token)-1]
	flip := byte('A')
	if last == 'A' {
		flip = 'B'
	}
	tampered := s.alice.token[:len(s.alice.token)-1] + string(flip)
	time.Sleep(1100 * time.Millisecond) // let the short token expire

	cases := []struct{ name, user, token string }{
		{"wrong", "alice", "pwt_0000000000000000_nope"},
		{"not a token", "alice", "hunter2"},
		{"tampered", "alice", tampered},
		{"expired", "alice", expired},
		{"revoked", "alice", revoked},
		{"alice's token as bob", "bob", s.alice.token},
	}
	for _, c := range cases {
		u := fmt.Sprintf("http://%s:%s@%s/team/app", c.user, url.PathEscape(c.token), s.HTTPAddr)
		out, err := s.env.Run(w, nil, "push", u, "HEAD:refs/heads/main")
		if err == nil || !strings.Contains(out, "invalid credentials") {
			t.Errorf("%s: want invalid credentials: %v\n%s", c.name, err, out)
		}
	}
	if after := s.env.Git(bare, "show-ref"); after != before {
		t.Fatal("refs changed by refused pushes")
	}

	// Removing bob ends his token and key at once: the key reads as
	// anonymous, and cannot push.
	if out, err := s.git(t, w, "ssh", bob, "team/app", "push", "URL", "HEAD:refs/heads/bob"); err != nil {
		t.Fatalf("bob's push before removal: %v\n%s", err, out)
	}
	if err := s.Data.Store.RemoveUser(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if out, err := s.git(t, w, "ssh", bob, "team/app", "push", "URL", "HEAD:refs/heads/bob2"); err == nil || !strings.Contains(out, "requires authentication") {
		t.Fatalf("removed user's key pushed: %v\n%s", err, out)
	}
	if out, err := s.git(t, w, "http", bob, "team/app", "push", "URL", "HEAD:refs/heads/bob2"); err == nil || !strings.Contains(out, "invalid credentials") {
		t.Fatalf("removed user's token pushed: %v\n%s", err, out)
	}
	if refOf(s, bare, "refs/heads/bob2") != "" {
		t.Fatal("removed user wrote a ref")
	}
}

// TestSSHUserNameIgnored: the identity is the key; the SSH user name, whatever
// it is, changes nothing.
func TestSSHUserNameIgnored(t *testing.T) {
	t.Parallel()
	s := startAccessServer(t)
	bare := s.seed(t, "team/app")
	s.grant(t, "alice", "write", "team/app")
	w := s.work(t, bare)
	_, port, _ := strings.Cut(s.SSHAddr.String(), ":")
	for i, user := range []string{"git", "alice", "root", "bob"} {
		u := fmt.Sprintf("ssh://%s@127.0.0.1:%s/team/app", user, port)
		out, err := s.env.Run(w, []string{gittest.SSHCommandEnv(s.alice.key)}, "push", u, fmt.Sprintf("HEAD:refs/heads/u%d", i))
		if err != nil {
			t.Fatalf("push as %s@: %v\n%s", user, err, out)
		}
	}
	if n := countLogLines(s.logs.String(), "msg=request ", "transport=ssh ", "service=git-receive-pack ", "repo=team/app ", "user=alice "); n != 4 {
		t.Fatalf("want 4 pushes logged as alice, got %d", n)
	}
}

// TestPathTricks: names that try to reach another repository than the
// one granted, on every transport.
func TestPathTricks(t *testing.T) {
	t.Parallel()
	s := startAccessServer(t)
	ctx := context.Background()
	s.seed(t, "team/app")
	secret := s.seed(t, "secret/x")
	s.grant(t, "alice", "write", "team/*")
	if err := s.Data.Store.SetSetting(ctx, "anonymous-read", "off"); err != nil {
		t.Fatal(err)
	}
	// A symlink inside the repository root is an alias: access is decided
	// on the repository it leads to.
	if out, err := exec.Command("ln", "-s", secret, filepath.Join(s.Data.Dir, "repos", "team", "link.git")).CombinedOutput(); err != nil {
		t.Fatalf("ln: %v %s", err, out)
	}
	tricks := []string{"team/../secret/x", "team/%2e%2e/secret/x", "team/%2E%2E/secret/x", "team%2F..%2Fsecret%2Fx", "Team/App", "TEAM/app", "secret/X", "team/link", "team/./../secret/x", "/team/../../secret/x", "team//../secret/x"}
	dir := t.TempDir()
	for _, transport := range []string{"git", "http", "ssh"} {
		for _, who := range []*actor{anon, s.alice} {
			if transport == "git" && who != anon {
				continue
			}
			for _, trick := range tricks {
				out, err := s.git(t, dir, transport, who, trick, "ls-remote", "URL")
				if err == nil {
					t.Errorf("%s %s %q: read:\n%s", transport, who.name, trick, out)
				}
				if transport != "git" && who != anon {
					out, err = s.git(t, dir, transport, who, trick, "push", "URL", "refs/heads/main:refs/heads/pwned")
					if err == nil {
						t.Errorf("%s %s %q: push accepted:\n%s", transport, who.name, trick, out)
					}
				}
			}
		}
	}
	if refOf(s, secret, "refs/heads/pwned") != "" {
		t.Fatal("a trick pushed into secret/x")
	}
	// The plain path still works for alice.
	if out, err := s.git(t, dir, "ssh", s.alice, "team/app", "ls-remote", "URL"); err != nil {
		t.Fatalf("alice ls-remote: %v\n%s", err, out)
	}
}

// TestSSHShellInjection: a command that tries to run more than git.
func TestSSHShellInjection(t *testing.T) {
	t.Parallel()
	s := startAccessServer(t)
	s.seed(t, "team/app")
	s.grant(t, "alice", "admin", "**")
	_, port, _ := strings.Cut(s.SSHAddr.String(), ":")
	marker := filepath.Join(t.TempDir(), "pwned")
	for _, cmd := range []string{
		"git-upload-pack 'team/app'; touch " + marker,
		"git-upload-pack 'team/app' && touch " + marker,
		"git-upload-pack '$(touch " + marker + ")'",
		"git-upload-pack `touch " + marker + "`",
		"git-receive-pack 'team/app' | touch " + marker,
		"touch " + marker,
	} {
		args := append(gittest.SSHOptions(s.alice.key, "", "-p", port, "git@127.0.0.1"), cmd)
		c := exec.Command("ssh", args...)
		c.Env = s.env.Vars
		out, err := c.CombinedOutput()
		if err == nil {
			t.Errorf("%q succeeded:\n%s", cmd, out)
		}
	}
	if _, err := exec.Command("test", "-e", marker).CombinedOutput(); err == nil {
		t.Fatal("a shell ran")
	}
}

// TestConcurrentPushesOneRef: two clients push different commits to main at
// once: exactly one wins, the other gets a clean rejection.
func TestConcurrentPushesOneRef(t *testing.T) {
	t.Parallel()
	for _, transport := range pushTransports {
		t.Run(transport, func(t *testing.T) {
			s := startAccessServer(t)
			bare := s.seed(t, "team/app")
			s.grant(t, "alice", "write", "**")
			s.protect(t, "**", "refs/heads/main")
			for round := 0; round < 3; round++ {
				var commits [2]string
				var works [2]string
				for i := range works {
					works[i] = s.work(t, bare)
					commits[i] = s.commit(works[i], fmt.Sprintf("client %d round %d", i, round))
				}
				var wg sync.WaitGroup
				var outs [2]string
				var errs [2]error
				for i := range works {
					wg.Add(1)
					go func() {
						defer wg.Done()
						outs[i], errs[i] = s.git(t, works[i], transport, s.alice, "team/app", "push", "URL", "HEAD:refs/heads/main")
					}()
				}
				wg.Wait()
				wins := 0
				for i := range works {
					if errs[i] == nil {
						wins++
						if refOf(s, bare, "main") != commits[i] {
							t.Fatalf("round %d: winner %d's commit is not main", round, i)
						}
					} else if !strings.Contains(outs[i], "rejected") && !strings.Contains(outs[i], "failed to update ref") && !strings.Contains(outs[i], "cannot lock ref") {
						t.Fatalf("round %d: loser %d without a clean rejection:\n%s", round, i, outs[i])
					}
				}
				if wins != 1 {
					t.Fatalf("round %d: %d winners:\n%s\n---\n%s", round, wins, outs[0], outs[1])
				}
				s.env.Fsck(bare)
			}
		})
	}
}

// TestHTTPPushProbe: before a push body larger than http.postBuffer, git
// probes with a body of just "0000" and needs 200 to go on.
func TestHTTPPushProbe(t *testing.T) {
	t.Parallel()
	s := startAccessServer(t)
	bare := s.seed(t, "team/app")
	s.grant(t, "alice", "write", "**")
	req, _ := http.NewRequest("POST", s.httpURL("team/app/git-receive-pack"), strings.NewReader("0000"))
	req.SetBasicAuth("alice", s.alice.token)
	req.Header.Set("Content-Type", "application/x-git-receive-pack-request")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("probe: %d", resp.StatusCode)
	}
	// A real push with a tiny postBuffer takes the probe path.
	w := s.work(t, bare)
	big := make([]byte, 256<<10)
	rand.Read(big)
	os.WriteFile(filepath.Join(w, "big.bin"), big, 0o644)
	s.env.Git(w, "add", ".")
	s.env.Git(w, "commit", "-qm", "big")
	out, err := s.git(t, w, "http", s.alice, "team/app", "-c", "http.postBuffer=65536", "push", "URL", "HEAD:refs/heads/big")
	if err != nil {
		t.Fatalf("push through the probe: %v\n%s", err, out)
	}
	if refOf(s, bare, "refs/heads/big") != s.env.RevParse(w, "HEAD") {
		t.Fatal("push not written")
	}
	if n := countLogLines(s.logs.String(), "msg=request ", "service=git-receive-pack ", "user=alice ", " bytes_in=0 ", " bytes_out=0 "); n != 2 {
		t.Fatalf("want two probes (ours and git's), saw %d", n)
	}
}

// countLogLines counts log lines holding every one of parts, in any order
// (the request line's fields are not this test's business).
func countLogLines(logs string, parts ...string) int {
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		all := true
		for _, p := range parts {
			if !strings.Contains(line+" ", p) {
				all = false
				break
			}
		}
		if all {
			n++
		}
	}
	return n
}

// TestTokenConventionalUserNames: GitHub's "x-access-token" and GitLab's
// "oauth2" user names carry a token the way "token" does: the token alone
// says who it is, and a wrong token is still 401.
func TestTokenConventionalUserNames(t *testing.T) {
	t.Parallel()
	s := startAccessServer(t)
	ctx := context.Background()
	bare := s.seed(t, "team/app")
	s.grant(t, "alice", "write", "**")
	bob := s.addUser(t, "bob")
	s.grant(t, "bob", "read", "**")
	if err := s.Data.Store.SetSetting(ctx, "anonymous-read", "off"); err != nil {
		t.Fatal(err) // the clone must need the token
	}
	for _, name := range []string{"x-access-token", "oauth2"} {
		t.Run(name, func(t *testing.T) {
			asAlice := &actor{name: name, token: s.alice.token}
			dir := filepath.Join(t.TempDir(), "clone")
			if out, err := s.git(t, "", "http", asAlice, "team/app", "clone", "URL", dir); err != nil {
				t.Fatalf("clone as %s:TOKEN: %v\n%s", name, err, out)
			}
			pushed := s.commit(dir, "pushed as "+name)
			if out, err := s.git(t, dir, "http", asAlice, "team/app", "push", "URL", "HEAD:refs/heads/"+name); err != nil {
				t.Fatalf("push as %s:TOKEN: %v\n%s", name, err, out)
			}
			if refOf(s, bare, "refs/heads/"+name) != pushed {
				t.Fatalf("push as %s:TOKEN did not land", name)
			}

			// The name grants nothing: bob's token is bob, who may only read.
			asBob := &actor{name: name, token: bob.token}
			out, err := s.git(t, dir, "http", asBob, "team/app", "push", "URL", "HEAD:refs/heads/bob-"+name)
			if err == nil || !strings.Contains(out, "bob may not write") {
				t.Fatalf("bob's token as %s pushed or was not refused as bob: %v\n%s", name, err, out)
			}

			wrong := &actor{name: name, token: "pwt_0000000000000000_nope"}
			out, err = s.git(t, dir, "http", wrong, "team/app", "ls-remote", "URL")
			if err == nil || !strings.Contains(out, "invalid credentials") {
				t.Fatalf("wrong token as %s: want invalid credentials: %v\n%s", name, err, out)
			}
			req, _ := http.NewRequest("GET", s.httpURL("team/app/info/refs?service=git-upload-pack"), nil)
			req.SetBasicAuth(name, wrong.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("wrong token as %s: status %d, want 401", name, resp.StatusCode)
			}
		})
	}
	if n := countLogLines(s.logs.String(), "msg=request ", "transport=http ", "service=git-receive-pack ", "user=alice "); n < 2 {
		t.Fatalf("pushes not logged as alice's (%d lines)", n)
	}
}

// TestCredentialCheckFailureIsNoAuthFailure: a store that cannot answer a
// token check (here its tokens table is gone) gets the client a 503 with
// a retry hint, not a 401: git would say "Authentication failed" and a
// credential helper would drop good credentials.
func TestCredentialCheckFailureIsNoAuthFailure(t *testing.T) {
	t.Parallel()
	s := startAccessServer(t)
	bare := s.seed(t, "team/app")
	s.grant(t, "alice", "write", "**")
	w := s.work(t, bare)
	if _, err := s.Data.Store.DB.Exec("DROP TABLE tokens"); err != nil {
		t.Fatal(err)
	}
	u := fmt.Sprintf("http://alice:%s@%s/team/app", url.PathEscape(s.alice.token), s.HTTPAddr)
	out, err := s.env.Run(w, nil, "push", u, "HEAD:refs/heads/other")
	if err == nil || !strings.Contains(out, "503") || strings.Contains(out, "Authentication failed") {
		t.Fatalf("token check against a broken store: %v\n%s", err, out)
	}
}
