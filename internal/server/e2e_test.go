package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/hostkeytest"
	"packwire/internal/store"
)

// testServer is a packwire started in-process on 127.0.0.1:0.
type testServer struct {
	*Server
	env   *gittest.Env
	token string // a token of user "alice"
	logs  *logBuffer
}

func startServer(t testing.TB, mutate func(*Config)) *testServer {
	t.Helper()
	env := gittest.New(t)
	logs := &logBuffer{}
	cfg := Defaults
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	cfg.GitAddr, cfg.HTTPAddr, cfg.SSHAddr = "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.Log = slog.New(slog.NewTextHandler(logs, nil))
	cfg.RecordsFlush = 20 * time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	if cfg.SSHAddr != "" {
		hostkeytest.Copy(t, cfg.DataDir) // generated once, not per server
	}
	ctx := context.Background()
	srv, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	if _, err := srv.Data.Store.AddUser(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	// alice writes everywhere, as before roles existed; access tests set their own.
	if err := srv.Data.Store.SetGrant(ctx, store.Grant{User: "alice", RepoPattern: "**", Role: "write"}); err != nil {
		t.Fatal(err)
	}
	token, err := srv.Data.Access.CreateToken(ctx, "alice", 0)
	if err != nil {
		t.Fatal(err)
	}
	return &testServer{Server: srv, env: env, token: token, logs: logs}
}

var (
	bigOnce     sync.Once
	bigTemplate string
)

// bigRepo creates a repository of 40 MiB of incompressible data (big enough
// that a clone is mid-pack for a while), cloned with hardlinks from
// bigTemplatePath for each test.
func (s *testServer) bigRepo(t testing.TB, name string) string {
	t.Helper()
	path := s.Data.Repos.PathFor(name)
	os.MkdirAll(filepath.Dir(path), 0o755)
	s.env.Git("", "clone", "-q", "--mirror", bigTemplatePath(t, s.env), path)
	return path
}

// bigTemplatePath is the bare repository bigRepo copies (main: 2 commits,
// 40 files of 1 MiB of random bytes), built once per test binary: building
// it costs seconds of CPU. Nothing may write to it.
func bigTemplatePath(t testing.TB, env *gittest.Env) string {
	t.Helper()
	bigOnce.Do(func() {
		dir, err := os.MkdirTemp("", "packwire-big-")
		if err != nil {
			t.Fatal(err)
		}
		bigTemplate = filepath.Join(dir, "big.git")
		env.Build(bigTemplate, gittest.Shape{Commits: 2, Files: 40, BlobBytes: 1 << 20, Incompress: true, Seed: 7})
	})
	if bigTemplate == "" {
		t.Fatal("the big template repository failed to build (see the first test that used it)")
	}
	return bigTemplate
}

// seed creates a repository with a small history: 30 commits on main, two
// branches, three tags.
func (s *testServer) seed(t *testing.T, name string) string {
	t.Helper()
	r, err := s.Data.Repos.Create(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	s.env.Build(r.Path, gittest.Shape{Commits: 30, Files: 20, BlobBytes: 2000, Branches: 2, Tags: 3, Seed: 1})
	return r.Path
}

func (s *testServer) gitURL(name string) string { return fmt.Sprintf("git://%s/%s", s.GitAddr, name) }
func (s *testServer) httpURL(name string) string {
	return fmt.Sprintf("http://%s/%s", s.HTTPAddr, name)
}
func (s *testServer) pushURL(name string) string {
	return fmt.Sprintf("http://alice:%s@%s/%s", s.token, s.HTTPAddr, name)
}

// logBuffer collects the server's log lines for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// protocolEnv makes the client use protocol v0 or v2 and trace packets, so
// a test can prove which version was really spoken.
func protocolEnv(version int) []string {
	return []string{fmt.Sprintf("GIT_CONFIG_COUNT=1"), "GIT_CONFIG_KEY_0=protocol.version", fmt.Sprintf("GIT_CONFIG_VALUE_0=%d", version), "GIT_TRACE_PACKET=1"}
}

func assertProtocol(t *testing.T, trace string, version int) {
	t.Helper()
	spokeV2 := strings.Contains(trace, "< version 2")
	if (version == 2) != spokeV2 {
		t.Fatalf("wanted protocol v%d, trace says v2=%v:\n%s", version, spokeV2, lastLines(trace, 20))
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestFetchMatrix runs every read operation over git:// and HTTP with
// protocol v0 and v2 against the same repository.
func TestFetchMatrix(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	bare := s.seed(t, "team/app")
	env := s.env
	headOnServer := env.RevParse(bare, "main")
	oldCommit := env.RevParse(bare, "main~20")

	for _, transport := range []string{"git", "http"} {
		for _, version := range []int{0, 2} {
			url := s.gitURL("team/app")
			if transport == "http" {
				url = s.httpURL("team/app.git")
			}
			t.Run(fmt.Sprintf("%s/v%d", transport, version), func(t *testing.T) {
				dir := t.TempDir()
				pe := protocolEnv(version)
				run := func(cwd string, args ...string) string {
					t.Helper()
					out, err := env.Run(cwd, pe, args...)
					if err != nil {
						t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, lastLines(out, 30))
					}
					return out
				}

				out := run(dir, "ls-remote", url)
				assertProtocol(t, out, version)
				if !strings.Contains(out, headOnServer+"\trefs/heads/main") || !strings.Contains(out, "refs/tags/v2") {
					t.Fatalf("ls-remote misses refs:\n%s", lastLines(out, 10))
				}

				full := filepath.Join(dir, "full")
				assertProtocol(t, run(dir, "clone", url, full), version)
				if got := env.RevParse(full, "HEAD"); got != headOnServer {
					t.Fatalf("clone HEAD %s, server %s", got, headOnServer)
				}
				env.Fsck(full)

				shallow := filepath.Join(dir, "shallow")
				assertProtocol(t, run(dir, "clone", "--depth", "1", url, shallow), version)
				if n := strings.TrimSpace(env.Git(shallow, "rev-list", "--count", "HEAD")); n != "1" {
					t.Fatalf("shallow clone has %s commits", n)
				}

				for _, filter := range []string{"blob:none", "tree:0"} {
					partial := filepath.Join(dir, strings.ReplaceAll(filter, ":", "-"))
					assertProtocol(t, run(dir, "clone", "--filter="+filter, url, partial), version)
					if got := strings.TrimSpace(env.Git(partial, "config", "remote.origin.partialclonefilter")); got != filter {
						t.Fatalf("filter not recorded: %q", got)
					}
					// Checking out an old commit needs objects the clone left out:
					// the client fetches them from the promisor remote on demand.
					missingBefore := env.Git(partial, "rev-list", "--objects", "--missing=print", oldCommit)
					if !strings.Contains(missingBefore, "\n?") && !strings.HasPrefix(missingBefore, "?") {
						t.Fatalf("%s clone is not partial", filter)
					}
					run(partial, "checkout", "-q", oldCommit)
					if got := env.Git(partial, "rev-parse", "HEAD"); strings.TrimSpace(got) != oldCommit {
						t.Fatalf("checkout landed on %s", got)
					}
					if st := env.Git(partial, "status", "--porcelain"); st != "" {
						t.Fatalf("work tree differs after lazy fetch:\n%s", st)
					}
				}

				// Fetch after the server moved on.
				newCommit := pushCommit(t, s, "team/app", fmt.Sprintf("fetch-%s-%d", transport, version))
				out = run(full, "fetch", "origin")
				assertProtocol(t, out, version)
				if got := env.RevParse(full, "origin/main"); got != newCommit {
					t.Fatalf("fetch got %s, want %s", got, newCommit)
				}
				env.Fsck(full)
			})
			headOnServer = env.RevParse(bare, "main")
		}
	}
}

// pushCommit adds a commit to main through an HTTP push and returns it.
func pushCommit(t *testing.T, s *testServer, repo, file string) string {
	t.Helper()
	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", s.pushURL(repo), w)
	os.WriteFile(filepath.Join(w, file), []byte(file+"\n"), 0o644)
	s.env.Git(w, "add", file)
	s.env.Git(w, "commit", "-qm", "add "+file)
	s.env.Git(w, "push", "-q", "origin", "main")
	return s.env.RevParse(w, "HEAD")
}

// TestPushHTTP covers new branch, fast-forward, force push and delete, with
// fsck of the server repository after each.
func TestPushHTTP(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	bare := s.seed(t, "team/app")
	env := s.env
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", s.pushURL("team/app"), w)

	commit := func(msg string) string {
		os.WriteFile(filepath.Join(w, "f.txt"), []byte(msg), 0o644)
		env.Git(w, "add", ".")
		env.Git(w, "commit", "-qm", msg)
		return env.RevParse(w, "HEAD")
	}
	for _, version := range []int{0, 2} {
		branch := fmt.Sprintf("feature-v%d", version)
		env.Git(w, "checkout", "-qb", branch, "main")
		c1 := commit("one " + branch)
		out, err := env.Run(w, protocolEnv(version), "push", "origin", branch)
		if err != nil {
			t.Fatalf("push new branch: %v\n%s", err, out)
		}
		if got := env.RevParse(bare, "refs/heads/"+branch); got != c1 {
			t.Fatalf("server has %s, want %s", got, c1)
		}
		env.Fsck(bare)

		// Force push: rewrite the branch.
		env.Git(w, "reset", "-q", "--hard", "HEAD~1")
		c2 := commit("rewritten " + branch)
		if out, err := env.Run(w, nil, "push", "origin", branch); err == nil {
			t.Fatalf("non-fast-forward push succeeded:\n%s", out)
		}
		if out, err := env.Run(w, nil, "push", "--force", "origin", branch); err != nil {
			t.Fatalf("force push: %v\n%s", err, out)
		}
		if got := env.RevParse(bare, "refs/heads/"+branch); got != c2 {
			t.Fatalf("after force push server has %s, want %s", got, c2)
		}
		env.Fsck(bare)

		// Push options are advertised and accepted.
		if out, err := env.Run(w, nil, "push", "-o", "ci.skip", "origin", branch+":opt-"+branch); err != nil {
			t.Fatalf("push with option: %v\n%s", err, out)
		}

		if out, err := env.Run(w, nil, "push", "origin", ":"+branch); err != nil {
			t.Fatalf("delete: %v\n%s", err, out)
		}
		if out, err := env.Run(bare, nil, "rev-parse", "--verify", "-q", "refs/heads/"+branch); err == nil {
			t.Fatalf("branch still there after delete: %s", out)
		}
		env.Fsck(bare)
	}
}

func TestPushRefusals(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	bare := s.seed(t, "team/app")
	env := s.env
	before := env.Git(bare, "show-ref")
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", s.httpURL("team/app"), w)
	env.Git(w, "commit", "-q", "--allow-empty", "-m", "x")

	cases := []struct {
		name, url, want string
	}{
		{"git:// push", s.gitURL("team/app"), "push over git:// is not supported"},
		{"http anonymous", s.httpURL("team/app"), "could not read Username"},
		{"http bad token", fmt.Sprintf("http://alice:pwt_0000000000000000_nope@%s/team/app", s.HTTPAddr), "invalid credentials"},
		{"http token of another user", fmt.Sprintf("http://bob:%s@%s/team/app", s.token, s.HTTPAddr), "invalid credentials"},
	}
	for _, c := range cases {
		out, err := env.Run(w, nil, "push", c.url, "HEAD:refs/heads/main")
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("%s: err=%v, want %q in:\n%s", c.name, err, c.want, out)
		}
	}
	if after := env.Git(bare, "show-ref"); after != before {
		t.Fatalf("refs changed by refused pushes")
	}
}

func TestArchiveOverGit(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	s.seed(t, "team/app")
	dir := t.TempDir()
	out := s.env.Git(dir, "archive", "--remote="+s.gitURL("team/app"), "--format=tar", "-o", filepath.Join(dir, "a.tar"), "main")
	_ = out
	list := s.env.Git(dir, "archive", "--remote="+s.gitURL("team/app"), "--format=zip", "-o", filepath.Join(dir, "a.zip"), "v1")
	_ = list
	for _, f := range []string{"a.tar", "a.zip"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Size() < 1000 {
			t.Fatalf("%s: %v", f, err)
		}
	}
}

func TestHTTPEndpoints(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	s.seed(t, "team/app")
	base := "http://" + s.HTTPAddr.String()
	get := func(path string, hdr map[string]string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("/team/app.git/info/refs?service=git-upload-pack", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-git-upload-pack-advertisement" ||
		!strings.HasPrefix(body, "001e# service=git-upload-pack\n0000") || !strings.Contains(resp.Header.Get("Cache-Control"), "no-cache") {
		t.Fatalf("v0 info/refs: %d %v %q", resp.StatusCode, resp.Header, body[:min(len(body), 80)])
	}
	resp, body = get("/team/app/info/refs?service=git-upload-pack", map[string]string{"Git-Protocol": "version=2"})
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "000eversion 2\n") {
		t.Fatalf("v2 info/refs: %d %q", resp.StatusCode, body[:min(len(body), 80)])
	}
	for path, want := range map[string]int{
		"/team/app/info/refs":                            403, // dumb HTTP
		"/team/app/info/refs?service=git-upload-archive": 403,
		"/team/app/info/refs?service=evil":               403,
		"/nope/info/refs?service=git-upload-pack":        404,
		"/team/app/HEAD":                                 404,
		"/team/app/git-upload-pack":                      405,
	} {
		if resp, _ := get(path, nil); resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// TestShutdownGraceful: a connection that never sends its request does
// not hold shutdown up, and new requests are refused after it. (A clone
// running through a shutdown completes: cmd/packwire TestServeSignal.)
func TestShutdownGraceful(t *testing.T) {
	s := startServer(t, nil)
	s.seed(t, "team/app")
	addr := s.GitAddr.String()
	// A connection that never sends its request must not hold shutdown up.
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("shutdown took %v with only an idle connection", d)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatalf("listener still accepting after shutdown")
	}
}
