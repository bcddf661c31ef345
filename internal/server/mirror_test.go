package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/access"
	"packwire/internal/gittest"
	"packwire/internal/governor"
	"packwire/internal/mirror"
	"packwire/internal/repo"
	"packwire/internal/store"
	"packwire/internal/webhook"
)

// refsOf lists a bare repository's refs as "ID REF" lines, packwire's
// hidden ones left out.
func refsOf(t *testing.T, env *gittest.Env, bare string) string {
	t.Helper()
	var keep []string
	for _, l := range strings.Split(env.Git(bare, "for-each-ref", "--format=%(objectname) %(refname)"), "\n") {
		if l != "" && !strings.Contains(l, " refs/packwire/") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// privateUpstream is a second packwire holding "src", readable only with
// alice's token: the upstream of pull mirrors and the target of push
// mirrors, reached with credentials.
func privateUpstream(t *testing.T) (*testServer, string) {
	t.Helper()
	up := startServer(t, nil)
	if err := up.Data.Store.SetSetting(context.Background(), access.SettingAnonRead, "off"); err != nil {
		t.Fatal(err)
	}
	return up, fmt.Sprintf("http://alice:%s@%s/", up.token, up.HTTPAddr)
}

// registerKey gives alice an SSH key on s and returns its path.
func registerKey(t *testing.T, s *testServer) string {
	t.Helper()
	key := s.env.NewSSHKey(fmt.Sprintf("alice_%d", time.Now().UnixNano()))
	text, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, err := gossh.ParseAuthorizedKey(text)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Data.Store.AddKey(context.Background(), "alice", store.Key{Fingerprint: gossh.FingerprintSHA256(pub), PublicKey: string(gossh.MarshalAuthorizedKey(pub))}); err != nil {
		t.Fatal(err)
	}
	return key
}

// secretsAbsent fails the test if token appears in what the server shows
// or keeps in clear: access export, logs, request records, the mirror's
// config, the hooks list.
func secretsAbsent(t *testing.T, s *testServer, token string, r repo.Repo) {
	t.Helper()
	ctx := context.Background()
	secret := strings.SplitN(token, "_", 3)[2] // pwt_ID_SECRET
	export, err := s.Data.Access.Export(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := s.Governor.Last(ctx, 1000)
	if err != nil {
		t.Fatal(err)
	}
	recJSON, _ := json.Marshal(recs)
	config, _ := os.ReadFile(filepath.Join(r.Path, "config"))
	hooks, _ := s.Data.Store.Hooks(ctx)
	var hookText strings.Builder
	for _, h := range hooks {
		fmt.Fprintf(&hookText, "%s %s\n", webhook.RedactURL(h.URL), h.RepoPattern)
	}
	for what, text := range map[string]string{"access export": string(export), "logs": s.logs.String(), "request records": string(recJSON),
		"the repository's config": string(config), "hooks": hookText.String()} {
		if strings.Contains(text, secret) {
			t.Errorf("the credential appears in %s", what)
		}
	}
	fi, err := os.Stat(filepath.Join(r.Path, "packwire-credentials.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("credentials file: %v %v", fi, err)
	}
}

// TestPullMirror: a mirror of a private packwire repository, imported
// with a token in the URL, is brought up to date by a sync (a new commit,
// a deleted branch pruned, a new tag), recorded as mirror-sync with its
// bytes and CPU; pushes to it are refused over HTTP and SSH with a message
// naming its upstream; the token is nowhere to be read.
func TestPullMirror(t *testing.T) {
	t.Parallel()
	up, base := privateUpstream(t)
	upBare := up.seed(t, "src")
	m := startServer(t, func(c *Config) { c.SSHAddr = "127.0.0.1:0"; c.MirrorCheck = 0 })
	ctx := context.Background()

	r, shown, err := mirror.Import(ctx, m.Data.Repos, "mirrors/src", base+"src", mirror.ImportOptions{Mirror: true, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(shown, strings.SplitN(up.token, "_", 3)[2]) || !strings.Contains(shown, up.HTTPAddr.String()) {
		t.Fatalf("import shows %q", shown)
	}
	if a, b := refsOf(t, m.env, upBare), refsOf(t, m.env, r.Path); a != b {
		t.Fatalf("imported refs differ:\n%s\n%s", a, b)
	}

	// Upstream moves on: a commit on main, a branch deleted, a tag.
	w := filepath.Join(t.TempDir(), "w")
	up.env.Git("", "clone", "-q", up.pushURL("src"), w)
	commitAndPush(t, up.env, w, up.pushURL("src"))
	up.env.Git(w, "tag", "v-new")
	up.env.Git(w, "push", "-q", up.pushURL("src"), ":branch1", "v-new")
	res, err := m.Mirrors.Sync(ctx, r, "test")
	if err != nil {
		t.Fatal(err)
	}
	if a, b := refsOf(t, m.env, upBare), refsOf(t, m.env, r.Path); a != b {
		t.Fatalf("refs after the sync differ:\n%s\n%s", a, b)
	}
	if strings.Contains(refsOf(t, m.env, r.Path), "refs/heads/branch1") {
		t.Fatal("a branch deleted upstream was not pruned")
	}
	changed := map[string]bool{}
	for _, u := range res.Changed {
		changed[u.Ref] = true
	}
	if len(res.Changed) != 3 || !changed["refs/heads/main"] || !changed["refs/heads/branch1"] || !changed["refs/tags/v-new"] || res.Bytes <= 0 {
		t.Fatalf("sync result: %+v", res)
	}
	if entries, _ := filepath.Glob(filepath.Join(r.Path, ".packwire-mirror-*")); len(entries) != 0 {
		t.Fatalf("quarantine left behind: %v", entries)
	}
	// Clients get the new state.
	clone := filepath.Join(t.TempDir(), "c")
	m.env.Git("", "clone", "-q", m.gitURL("mirrors/src"), clone)
	if got, want := m.env.RevParse(clone, "HEAD"), up.env.RevParse(w, "HEAD"); got != want {
		t.Fatalf("clone of the mirror at %s, upstream at %s", got, want)
	}
	var rec governor.Record
	waitFor(t, 5*time.Second, "the mirror-sync record", func() bool {
		recs, _ := m.Governor.Last(ctx, 50)
		for _, r := range recs {
			if r.Kind == mirror.KindSync {
				rec = r
				return true
			}
		}
		return false
	})
	if rec.Repo != "mirrors/src" || rec.Result != governor.ResultOK || rec.BytesIn != res.Bytes || rec.PushedRefs != 3 ||
		rec.Wall <= 0 || rec.CPU() <= 0 || rec.Transport != mirror.Transport {
		t.Fatalf("record: %+v", rec)
	}

	// Pushes are refused, over every transport that can push.
	want := fmt.Sprintf("repository 'mirrors/src' is a read-only mirror of http://%s/src; push there instead", up.HTTPAddr)
	out, err := m.env.Run(clone, nil, "push", m.pushURL("mirrors/src"), "HEAD:refs/heads/new")
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("push over HTTP: %v\n%s", err, out)
	}
	t.Logf("git push over HTTP to the mirror:\n%s", out)
	key := registerKey(t, m)
	sshURL := fmt.Sprintf("ssh://git@%s/mirrors/src", m.SSHAddr)
	out, err = m.env.Run(clone, []string{gittest.SSHCommandEnv(key)}, "push", sshURL, "HEAD:refs/heads/new")
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("push over SSH: %v\n%s", err, out)
	}
	t.Logf("git push over SSH to the mirror:\n%s", out)
	if strings.Contains(refsOf(t, m.env, r.Path), "refs/heads/new") {
		t.Fatal("a push to the mirror wrote a ref")
	}
	waitFor(t, 5*time.Second, "the refused pushes' records", func() bool {
		recs, _ := m.Governor.Last(ctx, 50)
		n := 0
		for _, r := range recs {
			if r.Service == "git-receive-pack" && r.Result == governor.ResultRefused && strings.Contains(r.Error, "read-only mirror") {
				n++
			}
		}
		return n >= 2
	})
	secretsAbsent(t, m, up.token, r)
}

// TestPullMirrorSyncAllOrNothing: a sync whose ref transaction cannot
// complete (one ref locked) changes no ref at all, and a sync whose fetch
// fails (upstream gone) neither; both are recorded with their error, and
// the next sync applies everything.
func TestPullMirrorSyncAllOrNothing(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MirrorCheck = 0 })
	ctx := context.Background()
	upstream := filepath.Join(t.TempDir(), "up.git")
	s.env.Build(upstream, gittest.Shape{Commits: 5, Branches: 2, Tags: 1})
	r, _, err := mirror.Import(ctx, s.Data.Repos, "m", "file://"+upstream, mirror.ImportOptions{Mirror: true})
	if err != nil {
		t.Fatal(err)
	}
	before := refsOf(t, s.env, r.Path)
	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", upstream, w)
	commitAndPush(t, s.env, w, upstream)
	s.env.Git(w, "push", "-q", upstream, "HEAD:refs/heads/added", ":branch0")

	lock := filepath.Join(r.Path, "refs", "heads", "main.lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mirrors.Sync(ctx, r, "test"); err == nil {
		t.Fatal("a sync with main locked succeeded")
	}
	if got := refsOf(t, s.env, r.Path); got != before {
		t.Fatalf("a failed ref transaction changed refs:\n%s\nwas:\n%s", got, before)
	}
	st, _ := mirror.ReadState(r)
	if st.Result != governor.ResultGitError || !strings.Contains(st.Error, "main.lock") {
		t.Fatalf("state after the failed sync: %+v", st)
	}
	t.Logf("sync with a ref locked: %s", st.Error)
	os.Remove(lock)

	moved := upstream + ".moved"
	os.Rename(upstream, moved)
	if _, err := s.Mirrors.Sync(ctx, r, "test"); err == nil {
		t.Fatal("a sync from a missing upstream succeeded")
	}
	if got := refsOf(t, s.env, r.Path); got != before {
		t.Fatal("a failed fetch changed refs")
	}
	os.Rename(moved, upstream)

	res, err := s.Mirrors.Sync(ctx, r, "test")
	if err != nil {
		t.Fatal(err)
	}
	if a, b := refsOf(t, s.env, upstream), refsOf(t, s.env, r.Path); a != b || len(res.Changed) != 3 {
		t.Fatalf("after the sync (%d changes):\n%s\n%s", len(res.Changed), a, b)
	}
	st, _ = mirror.ReadState(r)
	if st.Result != governor.ResultOK || st.Error != "" || st.LastSuccess.IsZero() {
		t.Fatalf("state: %+v", st)
	}
	s.env.Fsck(r.Path)
}

// TestPullMirrorScheduledAndAnnounced: the server syncs a mirror on its
// interval without being asked, and the refs a sync changed reach the
// webhooks (transport "mirror").
func TestPullMirrorScheduledAndAnnounced(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { fastRetries(c); c.MirrorCheck = 100 * time.Millisecond })
	ctx := context.Background()
	recv := newHookReceiver(t, "127.0.0.1:0", nil)
	addHook(t, s.Data.Store, "mirrors/**", recv.URL, "")
	upstream := filepath.Join(t.TempDir(), "up.git")
	s.env.Build(upstream, gittest.Shape{Commits: 3})
	r, _, err := mirror.Import(ctx, s.Data.Repos, "mirrors/up", upstream, mirror.ImportOptions{Mirror: true, Interval: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", upstream, w)
	commitAndPush(t, s.env, w, upstream)
	head := s.env.RevParse(w, "HEAD")
	waitFor(t, 10*time.Second, "the scheduled sync", func() bool {
		return strings.Contains(refsOf(t, s.env, r.Path), head+" refs/heads/main")
	})
	waitFor(t, 10*time.Second, "the webhook of the sync", func() bool { return len(recv.requests()) >= 1 })
	var p webhook.Payload
	if err := json.Unmarshal(recv.requests()[0].body, &p); err != nil {
		t.Fatal(err)
	}
	if p.Event != webhook.EventPush || p.Repository != "mirrors/up" || p.Transport != mirror.Transport || p.Pusher != "" || len(p.Refs) != 1 || p.Refs[0].New != head {
		t.Fatalf("payload: %s", recv.requests()[0].body)
	}
}

// TestPushMirror: every acknowledged push to a repository with a push
// mirror reaches the mirror (a private packwire, with a token in the URL),
// a branch deletion included; the delivery is recorded and the push
// counted as mirror-push; the token is nowhere to be read.
func TestPushMirror(t *testing.T) {
	t.Parallel()
	target, base := privateUpstream(t)
	dst, err := target.Data.Repos.Create(context.Background(), "dst")
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, fastRetries)
	ctx := context.Background()
	src := s.seed(t, "src")
	r, err := s.Data.Repos.Resolve("src")
	if err != nil {
		t.Fatal(err)
	}
	pm, err := mirror.AddPush(ctx, r, base+"dst", "")
	if err != nil {
		t.Fatal(err)
	}
	if pm.ID != 1 || strings.Contains(pm.URL, "alice") {
		t.Fatalf("push mirror: %+v", pm)
	}

	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", s.httpURL("src"), w)
	commitAndPush(t, s.env, w, s.pushURL("src"))
	waitFor(t, 15*time.Second, "the push mirror to match", func() bool { return refsOf(t, s.env, src) == refsOf(t, s.env, dst.Path) })

	s.env.Git(w, "push", "-q", s.pushURL("src"), ":branch0")
	waitFor(t, 15*time.Second, "the deletion to reach the push mirror", func() bool {
		return !strings.Contains(refsOf(t, s.env, dst.Path), "refs/heads/branch0")
	})
	if a, b := refsOf(t, s.env, src), refsOf(t, s.env, dst.Path); a != b {
		t.Fatalf("push mirror differs:\n%s\n%s", a, b)
	}
	target.env.Fsck(dst.Path)
	ds, err := s.Data.Store.Deliveries(ctx, store.DeliveryFilter{Kind: store.KindPushMirror})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 {
		t.Fatalf("%d push mirror deliveries, want 2", len(ds))
	}
	for _, d := range ds {
		if d.State != store.DeliveryDelivered || d.Target != "src#1" {
			t.Fatalf("delivery: %+v", d)
		}
	}
	waitFor(t, 5*time.Second, "mirror-push records", func() bool {
		recs, _ := s.Governor.Last(ctx, 50)
		n := 0
		for _, rec := range recs {
			if rec.Kind == mirror.KindPush && rec.Result == governor.ResultOK && rec.Repo == "src" {
				n++
			}
		}
		return n >= 1
	})
	secretsAbsent(t, s, target.token, r)

	// Removed, it receives nothing more.
	if _, err := mirror.RemovePush(ctx, r, pm.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.Path, "packwire-credentials.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("credentials left after the mirror was removed: %v", err)
	}
	before := refsOf(t, s.env, dst.Path)
	commitAndPush(t, s.env, w, s.pushURL("src"))
	time.Sleep(500 * time.Millisecond)
	if refsOf(t, s.env, dst.Path) != before {
		t.Fatal("a removed push mirror still receives pushes")
	}
}

// TestPullMirrorSyncsSerialized: syncs of one mirror asked for at once
// (three on demand, as `repo sync` and the cluster's RPC run them, while
// the scheduler syncs it every few milliseconds) all succeed and leave it
// equal to upstream: the later ones wait for the one under way and find
// what it left. Before, two syncs read the same refs and the second's
// transaction failed ("cannot lock ref ... is at X but expected Y").
func TestPullMirrorSyncsSerialized(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MirrorCheck = 10 * time.Millisecond })
	ctx := context.Background()
	upstream := filepath.Join(t.TempDir(), "up.git")
	s.env.Build(upstream, gittest.Shape{Commits: 3})
	r, _, err := mirror.Import(ctx, s.Data.Repos, "m", "file://"+upstream, mirror.ImportOptions{Mirror: true, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", upstream, w)
	for round := range 5 {
		commitAndPush(t, s.env, w, upstream)
		errs := make(chan error, 3)
		for range 3 {
			go func() {
				_, err := s.Mirrors.Sync(ctx, r, "test")
				errs <- err
			}()
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: a sync beside others failed: %v", round, err)
			}
		}
		if a, b := refsOf(t, s.env, upstream), refsOf(t, s.env, r.Path); a != b {
			t.Fatalf("round %d: mirror differs from upstream:\n%s\n%s", round, b, a)
		}
	}
	if logs := s.logs.String(); strings.Contains(logs, "sync failed") {
		t.Fatalf("a scheduled sync failed:\n%s", logs)
	}
}
