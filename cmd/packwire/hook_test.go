package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/access"
	"packwire/internal/gittest"
	"packwire/internal/server"
	"packwire/internal/servertest"
	"packwire/internal/webhook"
)

// TestHookAndMirrorCommandsHelp: every new command answers --help with
// its synopsis and flags, and creates nothing.
func TestHookAndMirrorCommandsHelp(t *testing.T) {
	dir := t.TempDir()
	for _, c := range [][]string{
		{"hook", "add"}, {"hook", "list"}, {"hook", "remove"}, {"hook", "deliveries"},
		{"repo", "import"}, {"repo", "sync"}, {"repo", "mirror", "add"}, {"repo", "mirror", "list"}, {"repo", "mirror", "remove"},
	} {
		name := strings.Join(c, " ")
		out, code := packwireIn(t, dir, append(c, "--help")...)
		if code != 0 || !strings.HasPrefix(out, "usage: packwire "+name) || !strings.Contains(out, "-data") {
			t.Errorf("%s --help: %d\n%s", name, code, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("--help created %v", entries)
	}
	top, _ := packwire(t, "help")
	for _, name := range []string{"hook add", "hook list", "repo sync", "repo mirror add"} {
		if !strings.Contains(top, "  "+name) {
			t.Errorf("top-level usage does not list %q", name)
		}
	}
	for _, flag := range []string{"-secret", "-events"} {
		if out, _ := packwire(t, "hook", "add", "--help"); !strings.Contains(out, flag) {
			t.Errorf("hook add --help lacks %s", flag)
		}
	}
	for _, flag := range []string{"-mirror", "-interval", "-token"} {
		if out, _ := packwire(t, "repo", "import", "--help"); !strings.Contains(out, flag) {
			t.Errorf("repo import --help lacks %s", flag)
		}
	}
}

// packwireIn runs the binary in dir.
func packwireIn(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	wd, _ := os.Getwd()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd)
	return packwire(t, args...)
}

// TestHookAndMirrorCommands drives the commands against a running
// server, as an admin would: a hook (its secret never printed back), a
// repo-create the server delivers, the delivery and its attempt listed; a
// pull mirror imported with a token, synced on demand; a push mirror that
// receives a push; credentials in no output and not in access export.
func TestHookAndMirrorCommands(t *testing.T) {
	srv := servertest.Start(t, func(c *server.Config) {
		c.DeliveryPoll, c.DeliveryMinBackoff, c.DeliveryMaxBackoff = 50*time.Millisecond, 100*time.Millisecond, 200*time.Millisecond
		c.MirrorCheck = 0
	})
	data := srv.Data.Dir
	var mu sync.Mutex
	var got []*http.Request
	var bodies [][]byte
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got, bodies = append(got, r), append(bodies, b)
		mu.Unlock()
	}))
	defer recv.Close()
	received := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }

	if out, code := packwire(t, "hook", "add", "team/**", "ftp://example.com/x", "--data", data); code != 2 || !strings.Contains(out, `scheme "ftp" refused`) {
		t.Fatalf("hook add ftp://: %d %s", code, out)
	}
	const hookSecret = "hook-secret-5f1e"
	out, code := packwire(t, "hook", "add", "team/**", recv.URL+"/in", "--secret", hookSecret, "--events", "repo-create,push", "--data", data)
	if code != 0 || !strings.Contains(out, "hook 1 added") || !strings.Contains(out, "secret set") || strings.Contains(out, hookSecret) {
		t.Fatalf("hook add: %d %s", code, out)
	}
	out, _ = packwire(t, "hook", "list", "--data", data)
	if !strings.Contains(out, "team/**") || !strings.Contains(out, recv.URL) || !strings.Contains(out, "set") || strings.Contains(out, hookSecret) {
		t.Fatalf("hook list:\n%s", out)
	}
	out, _ = packwire(t, "hook", "list", "--json", "--data", data)
	var listed []struct {
		ID     int64 `json:"id"`
		Secret bool  `json:"secret"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != 1 || !listed[0].Secret || strings.Contains(out, hookSecret) {
		t.Fatalf("hook list --json: %v\n%s", err, out)
	}

	// The command line queues; the running server delivers.
	if out, code := packwire(t, "repo", "create", "team/app", "--data", data); code != 0 {
		t.Fatalf("repo create: %d %s", code, out)
	}
	waitUntil(t, 10*time.Second, "the repo-create delivery", func() bool { return received() == 1 })
	mu.Lock()
	r0, b0 := got[0], bodies[0]
	mu.Unlock()
	var p webhook.Payload
	if err := json.Unmarshal(b0, &p); err != nil || p.Event != webhook.EventRepoCreate || p.Repository != "team/app" ||
		r0.Header.Get(webhook.HeaderEvent) != "repo-create" || !webhook.Verify(hookSecret, b0, r0.Header.Get(webhook.HeaderSignature)) {
		t.Fatalf("repo-create delivery: %v %s %v", err, b0, r0.Header)
	}
	waitUntil(t, 5*time.Second, "the delivery listed as delivered", func() bool {
		out, _ := packwire(t, "hook", "deliveries", "1", "--data", data)
		return strings.Contains(out, "delivered") && strings.Contains(out, "HTTP 200")
	})
	out, _ = packwire(t, "hook", "deliveries", "--json", "--data", data)
	var ds []struct {
		State    string          `json:"state"`
		Event    string          `json:"event"`
		Payload  json.RawMessage `json:"payload"`
		Attempts []struct {
			Status  int   `json:"status"`
			Latency int64 `json:"latency_ns"`
		} `json:"attempt_log"`
	}
	if err := json.Unmarshal([]byte(out), &ds); err != nil || len(ds) != 1 || ds[0].State != "delivered" || len(ds[0].Attempts) != 1 ||
		ds[0].Attempts[0].Status != 200 || ds[0].Attempts[0].Latency <= 0 || !strings.Contains(string(ds[0].Payload), `"repo-create"`) {
		t.Fatalf("hook deliveries --json: %v\n%s", err, out)
	}

	// A private upstream packwire, reached with a token.
	up := servertest.Start(t, nil)
	token := up.Token(t, "bob", "write")
	tokenSecret := strings.SplitN(token, "_", 3)[2]
	if err := up.Data.Store.SetSetting(context.Background(), access.SettingAnonRead, "off"); err != nil {
		t.Fatal(err)
	}
	upBare := up.Repo(t, "src", gittest.Shape{Commits: 4, Branches: 1})
	if _, err := up.Data.Repos.Create(context.Background(), "dst"); err != nil {
		t.Fatal(err)
	}
	withToken := func(name string) string { return fmt.Sprintf("http://bob:%s@%s/%s", token, up.HTTPAddr, name) }
	var shown []string
	run := func(args ...string) string {
		t.Helper()
		out, code := packwire(t, append(args, "--data", data)...)
		if code != 0 {
			t.Fatalf("%s: %d\n%s", strings.Join(args, " "), code, out)
		}
		shown = append(shown, out)
		return out
	}
	out = run("repo", "import", "team/mirror", withToken("src"), "--mirror", "--interval", "1h", "--no-maintain")
	if !strings.Contains(out, fmt.Sprintf("a read-only mirror of http://%s/src, synced every 1h0m0s", up.HTTPAddr)) {
		t.Fatalf("repo import --mirror:\n%s", out)
	}
	out = run("repo", "mirror", "list", "team/mirror")
	if !strings.Contains(out, "read-only mirror of http://"+up.HTTPAddr.String()+"/src (credentials stored)") || !strings.Contains(out, "none since the import") {
		t.Fatalf("repo mirror list:\n%s", out)
	}
	// Upstream moves on; repo sync brings it.
	env := up.Env
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", withToken("src"), w)
	os.WriteFile(filepath.Join(w, "x.txt"), []byte("x\n"), 0o644)
	env.Git(w, "add", ".")
	env.Git(w, "commit", "-qm", "x")
	env.Git(w, "push", "-q", "origin", "HEAD:main", ":branch0")
	out = run("repo", "sync", "team/mirror")
	if !strings.Contains(out, "synced team/mirror: 2 refs changed") || !strings.Contains(out, "refs/heads/branch0 (deleted)") {
		t.Fatalf("repo sync:\n%s", out)
	}
	mirrorPath := filepath.Join(data, "repos", "team", "mirror.git")
	if a, b := env.Git(upBare, "show-ref"), env.Git(mirrorPath, "show-ref"); a != b {
		t.Fatalf("mirror after repo sync:\n%s\n%s", a, b)
	}
	out = run("governor", "--last", "20")
	if !strings.Contains(out, "mirror-sync") {
		t.Fatalf("no mirror-sync record:\n%s", out)
	}
	out = run("repo", "mirror", "list", "team/mirror")
	if !strings.Contains(out, "last sync: ") || !strings.Contains(out, ", ok, 2 refs changed") {
		t.Fatalf("repo mirror list after a sync:\n%s", out)
	}

	// A push mirror of team/app receives what is pushed there.
	out = run("repo", "mirror", "add", "team/app", withToken("dst"))
	if !strings.Contains(out, "push mirror 1 of team/app added: http://"+up.HTTPAddr.String()+"/dst (credentials stored)") {
		t.Fatalf("repo mirror add:\n%s", out)
	}
	app := filepath.Join(t.TempDir(), "app")
	env.Git("", "init", "-q", app)
	os.WriteFile(filepath.Join(app, "a.txt"), []byte("a\n"), 0o644)
	env.Git(app, "add", ".")
	env.Git(app, "commit", "-qm", "a")
	aliceToken := srv.Token(t, "alice", "write")
	env.Git(app, "push", "-q", fmt.Sprintf("http://alice:%s@%s/team/app", aliceToken, srv.HTTPAddr), "HEAD:main")
	head := env.RevParse(app, "HEAD")
	dst := filepath.Join(up.Data.Repos.Dir, "dst.git")
	waitUntil(t, 15*time.Second, "the push mirror", func() bool {
		out, err := env.Run(dst, nil, "rev-parse", "--verify", "-q", "refs/heads/main")
		return err == nil && strings.TrimSpace(out) == head
	})
	waitUntil(t, 5*time.Second, "the push mirror's delivery listed", func() bool {
		out, _ := packwire(t, "repo", "mirror", "list", "team/app", "--data", data)
		shown = append(shown, out)
		return strings.Contains(out, "delivered after 1 attempts")
	})
	// The hook (team/**) heard of all of it: team/app's and team/mirror's
	// creation, the sync's refs (transport mirror) and the push.
	waitUntil(t, 10*time.Second, "four deliveries", func() bool { return received() == 4 })
	events := map[string]bool{}
	mu.Lock()
	for _, b := range bodies {
		var p webhook.Payload
		json.Unmarshal(b, &p)
		events[p.Event+" "+p.Repository+" "+p.Transport] = true
	}
	mu.Unlock()
	for _, want := range []string{"repo-create team/app ", "repo-create team/mirror ", "push team/mirror mirror", "push team/app http"} {
		if !events[want] {
			t.Errorf("no %q delivery; got %v", want, events)
		}
	}

	out = run("access", "export")
	shown = append(shown, out)
	for _, text := range shown {
		if strings.Contains(text, tokenSecret) || strings.Contains(text, hookSecret) {
			t.Fatalf("a credential is printed:\n%s", text)
		}
	}
	config, _ := os.ReadFile(filepath.Join(data, "repos", "team", "app.git", "config"))
	if strings.Contains(string(config), tokenSecret) {
		t.Fatal("the token is in the repository's config")
	}

	out = run("repo", "mirror", "remove", "team/app", "1")
	if !strings.Contains(out, "push mirror 1 of team/app removed") {
		t.Fatalf("repo mirror remove: %s", out)
	}
	if out, code := packwire(t, "repo", "mirror", "remove", "team/app", "1", "--data", data); code == 0 || !strings.Contains(out, "has no push mirror 1") {
		t.Fatalf("second remove: %d %s", code, out)
	}
	run("hook", "remove", "1")
	if out := run("hook", "list"); !strings.Contains(out, "no webhooks") {
		t.Fatalf("hook list after remove: %s", out)
	}
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHookListRedacts: hook list and hook add show a URL's credentials as
// ***, as written (the old code printed http://%2A%2A%2A@...).
func TestHookListRedacts(t *testing.T) {
	data := newData(t)
	out, code := packwire(t, "hook", "add", "team/**", "http://ci:pw-9f1@ci.example:8080/in?token=t0k", "--data", data)
	if code != 0 || !strings.Contains(out, "http://***@ci.example:8080/in?***") {
		t.Fatalf("hook add: %d %s", code, out)
	}
	out, _ = packwire(t, "hook", "list", "--data", data)
	if !strings.Contains(out, "http://***@ci.example:8080/in?***") || strings.Contains(out, "pw-9f1") || strings.Contains(out, "t0k") || strings.Contains(out, "%2A") {
		t.Fatalf("hook list:\n%s", out)
	}
}
