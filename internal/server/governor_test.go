package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/buildinfo"
	"packwire/internal/gittest"
	"packwire/internal/governor"
	"packwire/internal/store"
)

// withSSH turns the SSH listener on and returns the GIT_SSH_COMMAND
// environment of a key registered to alice.
func withSSH(t *testing.T) (func(*Config), func(*testServer) []string) {
	return func(c *Config) { c.SSHAddr = "127.0.0.1:0" }, func(s *testServer) []string {
		t.Helper()
		if _, err := exec.LookPath("ssh"); err != nil {
			t.Fatal("the OpenSSH client is not installed: run scripts/install-deps")
		}
		key := filepath.Join(s.env.Home, "id_ed25519")
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v %s", err, out)
		}
		pubBytes, _ := os.ReadFile(key + ".pub")
		pub, _, _, _, err := gossh.ParseAuthorizedKey(pubBytes)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Data.Store.AddKey(context.Background(), "alice", store.Key{Fingerprint: gossh.FingerprintSHA256(pub), PublicKey: string(pubBytes)}); err != nil {
			t.Fatal(err)
		}
		return []string{"GIT_SSH_COMMAND=ssh -F /dev/null -i " + key + " -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"}
	}
}

func (s *testServer) sshURL(name string) string {
	return fmt.Sprintf("ssh://git@%s/%s", s.SSHAddr, name)
}

// recordsAfter waits until the governor has records newer than seq that
// satisfy done, and returns them.
func (s *testServer) recordsAfter(t *testing.T, seq int64, done func([]governor.Record) bool) []governor.Record {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		recs, _, err := s.Governor.After(context.Background(), seq, time.Time{}, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if done(recs) {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("governor records after %d never satisfied the test: %+v", seq, recs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *testServer) lastSeq(t *testing.T) int64 {
	t.Helper()
	// Let queued records land first, so that "after" means after this point.
	time.Sleep(100 * time.Millisecond)
	seq, err := s.Governor.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func kinds(recs []governor.Record) []string {
	var k []string
	for _, r := range recs {
		k = append(k, r.Kind)
	}
	return k
}

func findKind(recs []governor.Record, kind string) (governor.Record, bool) {
	for _, r := range recs {
		if r.Kind == kind {
			return r, true
		}
	}
	return governor.Record{}, false
}

// TestGovernorKinds runs each kind of operation over each transport and
// protocol version and checks the record the governor kept.
func TestGovernorKinds(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, enableSSH)
	sshEnv := sshEnvFor(s)
	bare := s.seed(t, "team/app")
	env := s.env

	for _, transport := range []string{"git", "http", "ssh"} {
		for _, version := range []int{0, 2} {
			t.Run(fmt.Sprintf("%s/v%d", transport, version), func(t *testing.T) {
				url := map[string]string{"git": s.gitURL("team/app"), "http": s.httpURL("team/app"), "ssh": s.sshURL("team/app")}[transport]
				pushURL := map[string]string{"http": s.pushURL("team/app"), "ssh": url}[transport]
				extra := append(protocolEnv(version)[:3:3], sshEnv...)
				dir := t.TempDir()
				run := func(cwd string, args ...string) {
					t.Helper()
					if out, err := env.Run(cwd, extra, args...); err != nil {
						t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, lastLines(out, 20))
					}
				}
				expect := func(what string, kind string, check func(governor.Record) string, op func()) {
					t.Helper()
					seq := s.lastSeq(t)
					op()
					recs := s.recordsAfter(t, seq, func(r []governor.Record) bool { _, ok := findKind(r, kind); return ok })
					r, _ := findKind(recs, kind)
					if r.Transport != transport || r.Protocol != version && !(kind == "push" || kind == "archive") || r.Repo != "team/app" || r.Result != "ok" {
						t.Errorf("%s: record %+v", what, r)
					}
					if check != nil {
						if msg := check(r); msg != "" {
							t.Errorf("%s: %s: %+v", what, msg, r)
						}
					}
					for _, other := range recs {
						// git tries a push over HTTP without credentials first and gets a
						// 401: a challenge, not an error.
						authProbe := other.Result == governor.ResultChallenged && transport == "http" && strings.Contains(other.Error, "requires authentication")
						if other.Kind == "unknown" || other.Result != "ok" && !authProbe {
							t.Errorf("%s: unexpected record %+v", what, other)
						}
					}
				}
				full := filepath.Join(dir, "full")
				expect("clone", "full-clone", func(r governor.Record) string {
					if r.Wants == 0 || r.Haves != 0 || r.BytesOut < 10_000 || r.Wall <= 0 {
						return "wants/haves/bytes"
					}
					return ""
				}, func() { run(dir, "clone", url, full) })
				expect("shallow clone", "shallow-clone", func(r governor.Record) string {
					if r.Depth != 1 {
						return "depth"
					}
					return ""
				}, func() { run(dir, "clone", "--depth", "1", url, filepath.Join(dir, "shallow")) })
				expect("partial clone", "partial-clone", func(r governor.Record) string {
					if r.Filter != "blob:none" {
						return "filter"
					}
					return ""
				}, func() { run(dir, "clone", "--filter=blob:none", url, filepath.Join(dir, "partial")) })

				pushCommit(t, s, "team/app", fmt.Sprintf("gov-%s-%d", transport, version))
				expect("fetch", "incremental-fetch", func(r governor.Record) string {
					if r.Haves == 0 || r.Wants == 0 {
						return "haves"
					}
					return ""
				}, func() { run(full, "fetch", "origin") })
				pushCommit(t, s, "team/app", fmt.Sprintf("gov2-%s-%d", transport, version))
				expect("shallow fetch", "shallow-fetch", func(r governor.Record) string {
					if r.Depth != 1 {
						return "depth"
					}
					return ""
				}, func() { run(full, "fetch", "--depth", "1", "origin") })
				noOpKind := "no-op"
				if transport == "http" {
					noOpKind = "refs" // an up-to-date fetch over HTTP is its advertisement alone
				}
				expect("up-to-date fetch", noOpKind, nil, func() { run(full, "fetch", "origin") })
				if transport != "git" {
					os.WriteFile(filepath.Join(full, "pushed.txt"), []byte(fmt.Sprintf("%s v%d", transport, version)), 0o644)
					run(full, "add", "pushed.txt")
					run(full, "commit", "-qm", "push")
					run(full, "pull", "-q", "--rebase", "origin", "main")
					expect("push", "push", func(r governor.Record) string {
						if r.PushedRefs != 1 || r.User != "alice" || r.BytesIn == 0 {
							return "pushed refs/user/bytes in"
						}
						return ""
					}, func() { run(full, "push", pushURL, "HEAD:main") })
				}
				if transport != "http" {
					expect("archive", "archive", nil, func() {
						run(dir, "archive", "--remote="+url, "-o", filepath.Join(dir, "a.tar"), "main")
					})
				}
			})
		}
	}
	env.Fsck(bare)
}

// TestGovernorCountsCPU clones a repository of more than 10,000 objects over
// every transport and checks the record carries git CPU and the bytes. The
// fetch cache is off: the three transports share its entries, so the
// second and third clones would be replays, which run no git.
func TestGovernorCountsCPU(t *testing.T) {
	t.Parallel() // its records' CPU is their own git's (wait4), not the process's
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, func(c *Config) { enableSSH(c); c.FetchCache = false })
	sshEnv := sshEnvFor(s)
	r, _ := s.Data.Repos.Create(context.Background(), "many")
	s.env.Build(r.Path, gittest.Shape{Commits: 1000, Files: 300, BlobBytes: 600, Incompress: true, Seed: 5})
	objects := strings.Fields(s.env.Git(r.Path, "count-objects", "-v"))
	if len(objects) < 6 || objects[5] < "10000" && len(objects[5]) <= 4 {
		t.Fatalf("repository too small: %v", objects)
	}
	for _, url := range []string{s.gitURL("many"), s.httpURL("many"), s.sshURL("many")} {
		seq := s.lastSeq(t)
		if out, err := s.env.Run(t.TempDir(), sshEnv, "clone", "-q", url, "c"); err != nil {
			t.Fatalf("clone %s: %v %s", url, err, out)
		}
		recs := s.recordsAfter(t, seq, func(r []governor.Record) bool { _, ok := findKind(r, "full-clone"); return ok })
		rec, _ := findKind(recs, "full-clone")
		if rec.CPU() <= 0 || rec.BytesOut < 1<<20 || rec.MaxRSS <= 0 {
			t.Errorf("%s: cpu %v, bytes out %d, rss %d", url, rec.CPU(), rec.BytesOut, rec.MaxRSS)
		}
	}
}

func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	s.seed(t, "team/app")
	s.env.Git(t.TempDir(), "clone", "-q", s.gitURL("team/app"), "c")
	s.env.Run("", nil, "ls-remote", s.gitURL("missing"))
	time.Sleep(100 * time.Millisecond)
	ctx := context.Background()
	get := func(auth string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+s.HTTPAddr.String()+"/metrics", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	// Protected: a metrics-scoped token (as Prometheus sends it: Bearer, or
	// Basic) or a server admin's; not anonymous, not alice's (a writer).
	metricsToken, err := s.Data.Access.CreateScopedToken(ctx, "alice", 0, store.ScopeMetrics)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Data.Store.AddUser(ctx, "root"); err != nil {
		t.Fatal(err)
	}
	s.Data.Store.SetGrant(ctx, store.Grant{User: "root", RepoPattern: "**", Role: "admin"})
	adminToken, _ := s.Data.Access.CreateToken(ctx, "root", 0)
	for auth, want := range map[string]int{
		"":                                          401,
		"Basic " + basicAuth("alice", s.token):      403,
		"Bearer pwt_0000000000000000_wrong":         401,
		"Basic " + basicAuth("root", adminToken):    200,
		"Bearer " + metricsToken:                    200,
		"Basic " + basicAuth("alice", metricsToken): 200,
	} {
		if code, _ := get(auth); code != want {
			t.Errorf("/metrics with %q: %d, want %d", auth, code, want)
		}
	}
	// A metrics token is not one for git.
	s.Data.Store.SetSetting(ctx, "anonymous-read", "off")
	if out, err := s.env.Run(t.TempDir(), nil, "ls-remote", fmt.Sprintf("http://alice:%s@%s/team/app", metricsToken, s.HTTPAddr)); err == nil || !strings.Contains(out, "invalid credentials") {
		t.Errorf("git with a metrics token: %v\n%s", err, out)
	}
	_, text := get("Bearer " + metricsToken)
	build := buildinfo.Get()
	// Every record says which build served it.
	recs, err := s.Governor.Last(ctx, 10)
	if err != nil || len(recs) == 0 {
		t.Fatalf("records: %v %v", recs, err)
	}
	for _, r := range recs {
		if r.Version != build.Version || r.Version == "" {
			t.Errorf("record %s %s: version %q, want %q", r.Kind, r.Result, r.Version, build.Version)
		}
	}
	for _, want := range []string{
		`packwire_requests_total{kind="full-clone",result="ok",service="git-upload-pack",transport="git"} 1`,
		`packwire_requests_total{kind="unknown",result="refused",service="git-upload-pack",transport="git"} 1`,
		`packwire_git_cpu_seconds_total{kind="full-clone",mode="user",service="git-upload-pack",transport="git"}`,
		`packwire_bytes_total{direction="out",kind="full-clone",service="git-upload-pack",transport="git"}`,
		`packwire_request_duration_seconds_bucket{kind="full-clone"`,
		`packwire_requests_in_flight 0`,
		fmt.Sprintf(`packwire_build_info{goversion=%q,revision=%q,version=%q} 1`, build.GoVersion, build.Revision, build.Version),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics miss %s", want)
		}
	}
	if strings.Contains(text, "repo=") || strings.Contains(text, "user=") || strings.Contains(text, "team/app") {
		t.Error("metrics carry repo or user labels")
	}
}

// TestMetricsPublic: --metrics-public opens /metrics to anyone.
func TestMetricsPublic(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MetricsPublic = true })
	resp, err := http.Get("http://" + s.HTTPAddr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("public metrics: %d", resp.StatusCode)
	}
}

// TestRequestsAPI: the lab reads records over HTTP with a server admin's
// token; anyone else is refused.
func TestRequestsAPI(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	s.seed(t, "team/app")
	ctx := context.Background()
	s.env.Git(t.TempDir(), "clone", "-q", s.gitURL("team/app"), "c")
	s.Data.Store.AddUser(ctx, "root")
	rootToken, err := s.Data.Access.CreateToken(ctx, "root", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Data.Store.SetGrant(ctx, store.Grant{User: "root", Role: "admin", RepoPattern: "**"}); err != nil {
		t.Fatal(err)
	}
	get := func(user, token string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+s.HTTPAddr.String()+"/api/v1/requests?since=1h", nil)
		if token != "" {
			req.SetBasicAuth(user, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	time.Sleep(100 * time.Millisecond)
	if code, _ := get("", ""); code != 401 {
		t.Fatalf("no token: %d", code)
	}
	if code, _ := get("alice", s.token); code != 403 {
		t.Fatalf("non-admin token: %d", code)
	}
	if code, _ := get("root", "pwt_0000000000000000_bad"); code != 401 {
		t.Fatalf("bad token: %d", code)
	}
	code, body := get("root", rootToken)
	if code != 200 || !strings.Contains(body, `"kind":"full-clone"`) || !strings.Contains(body, `"next":`) {
		t.Fatalf("admin: %d %s", code, body)
	}
}
