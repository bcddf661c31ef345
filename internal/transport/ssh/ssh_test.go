package ssh

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/datadir"
	"packwire/internal/gitexec"
	"packwire/internal/gittest"
	"packwire/internal/pipeline"
	"packwire/internal/pktline"
	"packwire/internal/store"
)

// TestMain fails the package if any goroutine of this package or of the SSH
// library outlives the servers the tests started and closed.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := waitNoLeakedGoroutines(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines leaked after every server was closed:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

func waitNoLeakedGoroutines(timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "packwire/internal/transport/ssh.(*") ||
				strings.Contains(g, "golang.org/x/crypto/ssh.") ||
				strings.Contains(g, "packwire/internal/gitexec.") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// harness is one server on 127.0.0.1 with its own data directory, a git
// client environment, a registered key (alice) and an unregistered one.
type harness struct {
	t        *testing.T
	env      *gittest.Env
	data     *datadir.Data
	pipe     *pipeline.Pipeline
	srv      *Server
	port     string
	logs     *syncBuffer
	aliceKey string // private key file registered to alice
	anonKey  string // private key file nobody registered
}

func newHarness(t *testing.T, configure func(*Server)) *harness {
	t.Helper()
	for _, tool := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s (the OpenSSH client) is not installed: these tests drive the real client (scripts/install-deps installs it)", tool)
		}
	}
	env := gittest.New(t)
	ctx := context.Background()
	d, err := datadir.Create(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	pipe := &pipeline.Pipeline{Repos: d.Repos, Access: d.Access, Runner: &gitexec.Runner{}, Log: logger}
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	hostKey, err := gossh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Pipeline: pipe, Access: d.Access, HostKeys: []gossh.Signer{hostKey}, InitTimeout: 10 * time.Second, Log: logger}
	if configure != nil {
		configure(srv)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	h := &harness{t: t, env: env, data: d, pipe: pipe, srv: srv, logs: logs}
	_, h.port, _ = net.SplitHostPort(l.Addr().String())
	t.Cleanup(func() {
		srv.Close()
		shutdownCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := pipe.Shutdown(shutdownCtx); err != nil {
			t.Errorf("pipeline shutdown: %v", err)
		}
		waited := make(chan struct{})
		go func() { srv.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			t.Errorf("Wait did not return after Close")
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
		d.Close()
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	h.aliceKey = h.newKey("alice_key")
	h.anonKey = h.newKey("anon_key")
	if _, err := d.Store.AddUser(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	h.register("alice", h.aliceKey)
	if err := d.Store.SetGrant(ctx, store.Grant{User: "alice", RepoPattern: "**", Role: "write"}); err != nil {
		t.Fatal(err)
	}
	return h
}

// newKey makes an ed25519 key pair with ssh-keygen in the client's HOME.
func (h *harness) newKey(name string) string { return h.env.NewSSHKey(name) }

func (h *harness) register(user, keyFile string) {
	h.t.Helper()
	text, err := os.ReadFile(keyFile + ".pub")
	if err != nil {
		h.t.Fatal(err)
	}
	pub, _, _, _, err := gossh.ParseAuthorizedKey(text)
	if err != nil {
		h.t.Fatal(err)
	}
	err = h.data.Store.AddKey(context.Background(), user, store.Key{
		Fingerprint: gossh.FingerprintSHA256(pub),
		PublicKey:   string(gossh.MarshalAuthorizedKey(pub)),
	})
	if err != nil {
		h.t.Fatal(err)
	}
}

// signer loads a key file for the Go client used where OpenSSH cannot
// misbehave on demand.
func (h *harness) signer(keyFile string) gossh.Signer {
	h.t.Helper()
	pem, err := os.ReadFile(keyFile)
	if err != nil {
		h.t.Fatal(err)
	}
	s, err := gossh.ParsePrivateKey(pem)
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

// repo creates team/NAME style repositories filled with a history.
func (h *harness) repo(name string, shape gittest.Shape) string {
	h.t.Helper()
	r, err := h.data.Repos.Create(context.Background(), name)
	if err != nil {
		h.t.Fatal(err)
	}
	h.env.Build(r.Path, shape)
	return r.Path
}

// sshOptions are the OpenSSH options every client here uses. key "" means
// no key at all (keyboard-interactive, anonymous). logLevel "" is ERROR.
func (h *harness) sshOptions(key, logLevel string, extra ...string) []string {
	return gittest.SSHOptions(key, logLevel, extra...)
}

// sshCommand is a GIT_SSH_COMMAND value.
func (h *harness) sshCommand(key string, extra ...string) string {
	return gittest.SSHCommandEnv(key, extra...)
}

func (h *harness) url(repo string) string {
	return "ssh://git@127.0.0.1:" + h.port + "/" + repo
}

// git runs the git client with key; it returns combined output.
func (h *harness) git(dir, key string, args ...string) (string, error) {
	return h.env.Run(dir, []string{h.sshCommand(key)}, args...)
}

// mustGit is git that fails the test on error.
func (h *harness) mustGit(dir, key string, args ...string) string {
	h.t.Helper()
	out, err := h.git(dir, key, args...)
	if err != nil {
		h.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// sshCmd is the OpenSSH client pointed at the server with a remote command.
func (h *harness) sshCmd(key, logLevel string, args ...string) *exec.Cmd {
	all := append(h.sshOptions(key, logLevel, "-p", h.port, "git@127.0.0.1"), args...)
	cmd := exec.Command("ssh", all...)
	cmd.Env = h.env.Vars
	return cmd
}

type sshResult struct {
	stdout, stderr string
	code           int
}

func (h *harness) runSSH(key string, args ...string) sshResult {
	h.t.Helper()
	cmd := h.sshCmd(key, "", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		h.t.Fatalf("ssh: %v", err)
	}
	return sshResult{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

// dial connects the Go SSH client with signer (nil: keyboard-interactive).
func (h *harness) dial(signer gossh.Signer) *gossh.Client {
	h.t.Helper()
	auth := []gossh.AuthMethod{gossh.KeyboardInteractive(func(string, string, []string, []bool) ([]string, error) { return nil, nil })}
	if signer != nil {
		auth = []gossh.AuthMethod{gossh.PublicKeys(signer)}
	}
	client, err := gossh.Dial("tcp", "127.0.0.1:"+h.port, &gossh.ClientConfig{
		User: "git", Auth: auth, HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { client.Close() })
	return client
}

// dialAlice connects the Go SSH client as alice over wrap's wrapper of a
// new TCP connection to the server (a pausable or counting one); the
// client is closed with the test.
func (h *harness) dialAlice(wrap func(net.Conn) net.Conn) *gossh.Client {
	h.t.Helper()
	nc, err := net.Dial("tcp", "127.0.0.1:"+h.port)
	if err != nil {
		h.t.Fatal(err)
	}
	sconn, chans, reqs, err := gossh.NewClientConn(wrap(nc), nc.RemoteAddr().String(), &gossh.ClientConfig{
		User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(h.signer(h.aliceKey))}, HostKeyCallback: gossh.InsecureIgnoreHostKey(),
	})
	if err != nil {
		h.t.Fatal(err)
	}
	client := gossh.NewClient(sconn, chans, reqs) // answers probes (with a refusal) whenever it reads
	h.t.Cleanup(func() { client.Close() })
	return client
}

// execUploadPack starts git-upload-pack of repo ("/team/big.git") in a new
// session of client and returns it with its stdin and stdout.
func (h *harness) execUploadPack(client *gossh.Client, repo string) (*gossh.Session, io.WriteCloser, io.Reader) {
	h.t.Helper()
	sess, err := client.NewSession()
	if err != nil {
		h.t.Fatal(err)
	}
	stdin, _ := sess.StdinPipe()
	stdout, _ := sess.StdoutPipe()
	if err := sess.Start("git-upload-pack '" + repo + "'"); err != nil {
		h.t.Fatal(err)
	}
	return sess, stdin, stdout
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCloneAndFetch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	bare := h.repo("team/app", gittest.Shape{Commits: 5, Branches: 1, Tags: 2})
	for _, version := range []string{"0", "2"} {
		t.Run("v"+version, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "app")
			out, err := h.env.Run("", []string{h.sshCommand(h.aliceKey), "GIT_TRACE_PACKET=1"},
				"-c", "protocol.version="+version, "clone", h.url("team/app.git"), dir)
			if err != nil {
				t.Fatalf("clone: %v\n%s", err, out)
			}
			if got := strings.Contains(out, "< version 2"); got != (version == "2") {
				t.Fatalf("protocol v2 in use: %v, want %v\n%s", got, version == "2", out)
			}
			if got, want := h.env.RevParse(dir, "HEAD"), h.env.RevParse(bare, "main"); got != want {
				t.Fatalf("cloned HEAD %s, server main %s", got, want)
			}
			h.env.Fsck(dir)

			// A new commit on the server, then fetch it.
			next := strings.TrimSpace(h.env.Git(bare, "commit-tree", "-p", "main", "-m", "next v"+version, "main^{tree}"))
			h.env.Git(bare, "update-ref", "refs/heads/main", next)
			out, err = h.env.Run(dir, []string{h.sshCommand(h.aliceKey), "GIT_TRACE_PACKET=1"},
				"-c", "protocol.version="+version, "fetch", "origin")
			if err != nil {
				t.Fatalf("fetch: %v\n%s", err, out)
			}
			if got := strings.Contains(out, "< version 2"); got != (version == "2") {
				t.Fatalf("fetch: protocol v2 in use: %v, want %v\n%s", got, version == "2", out)
			}
			if got := h.env.RevParse(dir, "origin/main"); got != next {
				t.Fatalf("fetched origin/main %s, want %s", got, next)
			}
			if got := h.env.RevParse(dir, "origin/branch0"); got != h.env.RevParse(bare, "branch0") {
				t.Fatalf("origin/branch0 %s", got)
			}
		})
	}
}

func TestScpStyleAndKeyboardInteractive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	bare := h.repo("team/app", gittest.Shape{Commits: 3})
	want := h.env.RevParse(bare, "main")

	// host:path has no port, so it comes with the ssh command; the path is
	// then relative ('team/app.git').
	dir := filepath.Join(t.TempDir(), "scp")
	out, err := h.env.Run("", []string{h.sshCommand(h.aliceKey, "-p", h.port)}, "clone", "git@127.0.0.1:team/app.git", dir)
	if err != nil {
		t.Fatalf("scp-style clone: %v\n%s", err, out)
	}
	if got := h.env.RevParse(dir, "HEAD"); got != want {
		t.Fatalf("scp-style clone HEAD %s, want %s", got, want)
	}

	// No key at all: keyboard-interactive with no questions, anonymous.
	dir = filepath.Join(t.TempDir(), "nokey")
	h.mustGit("", "", "clone", h.url("team/app"), dir)
	if got := h.env.RevParse(dir, "HEAD"); got != want {
		t.Fatalf("keyless clone HEAD %s, want %s", got, want)
	}
	h.env.Git(dir, "commit", "--allow-empty", "-q", "-m", "anonymous")
	out, err = h.git(dir, "", "push", "origin", "HEAD:refs/heads/anon")
	if err == nil || !strings.Contains(out, "push to 'team/app' requires authentication") {
		t.Fatalf("keyless push: err %v, want the pipeline's refusal\n%s", err, out)
	}
	if !strings.Contains(h.logs.String(), "user=anonymous") {
		t.Fatalf("anonymous requests not logged as such:\n%s", h.logs.String())
	}
}

func TestShallowAndPartialClones(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	bare := h.repo("team/app", gittest.Shape{Commits: 6, Files: 12, ChangePerCo: 4})

	t.Run("depth", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "shallow")
		h.mustGit("", h.aliceKey, "clone", "--depth", "1", h.url("team/app.git"), dir)
		if n := strings.TrimSpace(h.env.Git(dir, "rev-list", "--count", "HEAD")); n != "1" {
			t.Fatalf("shallow clone has %s commits, want 1", n)
		}
		h.mustGit(dir, h.aliceKey, "fetch", "--deepen", "2")
		if n := strings.TrimSpace(h.env.Git(dir, "rev-list", "--count", "HEAD")); n != "3" {
			t.Fatalf("after --deepen 2: %s commits, want 3", n)
		}
	})
	for _, filter := range []string{"blob:none", "tree:0"} {
		t.Run(filter, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "partial")
			h.mustGit("", h.aliceKey, "clone", "--filter="+filter, h.url("team/app.git"), dir)
			if got := h.env.Git(dir, "config", "remote.origin.promisor"); strings.TrimSpace(got) != "true" {
				t.Fatalf("not a partial clone: promisor=%q", got)
			}
			// An old commit needs blobs (and trees) the clone does not have:
			// checkout fetches them lazily over SSH.
			requestsBefore := strings.Count(h.logs.String(), "msg=request ")
			h.mustGit(dir, h.aliceKey, "checkout", "-q", "HEAD~4")
			if strings.Count(h.logs.String(), "msg=request ") == requestsBefore {
				t.Fatal("checkout fetched nothing: the clone was not partial")
			}
			files := strings.Fields(h.env.Git(bare, "ls-tree", "-r", "--name-only", "main~4"))
			if len(files) != 12 {
				t.Fatalf("main~4 has %d files, want 12", len(files))
			}
			for _, f := range files {
				got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f)))
				if err != nil {
					t.Fatal(err)
				}
				if want := h.env.Git(bare, "show", "main~4:"+f); string(got) != want {
					t.Fatalf("%s at main~4 differs from the server's", f)
				}
			}
		})
	}
}

func TestPush(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	bare := h.repo("team/app", gittest.Shape{Commits: 3})
	dir := filepath.Join(t.TempDir(), "work")
	h.mustGit("", h.aliceKey, "clone", h.url("team/app.git"), dir)
	serverRef := func(ref string) string {
		out, err := h.env.Run(bare, nil, "rev-parse", "--verify", "-q", ref)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(out)
	}

	// A new branch with new content.
	h.env.Git(dir, "switch", "-q", "-c", "feature")
	if err := os.WriteFile(filepath.Join(dir, "new.txt"), []byte("pushed over ssh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.env.Git(dir, "add", "new.txt")
	h.env.Git(dir, "commit", "-q", "-m", "feature")
	h.mustGit(dir, h.aliceKey, "push", "origin", "feature")
	if got, want := serverRef("refs/heads/feature"), h.env.RevParse(dir, "HEAD"); got != want {
		t.Fatalf("server feature %q, want %s", got, want)
	}
	h.env.Fsck(bare)

	// Rewrite it: a plain push is refused, a forced one lands.
	h.env.Git(dir, "commit", "-q", "--amend", "-m", "feature, rewritten")
	if out, err := h.git(dir, h.aliceKey, "push", "origin", "feature"); err == nil {
		t.Fatalf("non-fast-forward push accepted:\n%s", out)
	}
	h.mustGit(dir, h.aliceKey, "push", "--force", "origin", "feature")
	if got, want := serverRef("refs/heads/feature"), h.env.RevParse(dir, "HEAD"); got != want {
		t.Fatalf("after force push: server feature %q, want %s", got, want)
	}
	h.env.Fsck(bare)

	// Delete it.
	h.mustGit(dir, h.aliceKey, "push", "origin", ":feature")
	if got := serverRef("refs/heads/feature"); got != "" {
		t.Fatalf("deleted branch still at %s", got)
	}
	h.env.Fsck(bare)

	// An unregistered key is anonymous: it may read, not push.
	anonDir := filepath.Join(t.TempDir(), "anon")
	h.mustGit("", h.anonKey, "clone", h.url("team/app.git"), anonDir)
	h.env.Git(anonDir, "commit", "--allow-empty", "-q", "-m", "anonymous")
	before := h.env.Git(bare, "show-ref")
	out, err := h.git(anonDir, h.anonKey, "push", "origin", "HEAD:refs/heads/anon")
	if err == nil || !strings.Contains(out, "push to 'team/app' requires authentication") {
		t.Fatalf("push with an unknown key: err %v, want the pipeline's refusal\n%s", err, out)
	}
	if after := h.env.Git(bare, "show-ref"); after != before {
		t.Fatalf("refused push changed refs:\n%s", after)
	}
	if !strings.Contains(h.logs.String(), "user=alice") {
		t.Fatalf("alice's requests not logged under her name:\n%s", h.logs.String())
	}
}

func TestArchive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.repo("team/app", gittest.Shape{Commits: 2, Files: 5})
	cmd := exec.Command("git", "archive", "--remote="+h.url("team/app.git"), "--format=tar", "HEAD")
	cmd.Env = append(append([]string{}, h.env.Vars...), h.sshCommand(h.aliceKey))
	cmd.Dir = t.TempDir()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	archive, err := cmd.Output()
	if err != nil {
		t.Fatalf("git archive --remote: %v\n%s", err, stderr.String())
	}
	// A refusal reaches git archive as a remote error.
	out, err := h.env.Run(t.TempDir(), []string{h.sshCommand(h.aliceKey)}, "archive", "--remote="+h.url("team/nope.git"), "HEAD")
	if err == nil || !strings.Contains(out, "remote error: repository 'team/nope.git' not found") {
		t.Fatalf("archive of an unknown repository: err %v\n%s", err, out)
	}

	tar := exec.Command("tar", "-t")
	tar.Stdin = bytes.NewReader(archive)
	list, err := tar.Output()
	if err != nil {
		t.Fatalf("tar -t: %v", err)
	}
	for _, f := range []string{"dir0/sub0/file0.txt", "dir4/sub1/file4.txt"} {
		if !strings.Contains(string(list), f) {
			t.Fatalf("archive lacks %s:\n%s", f, list)
		}
	}
}

// TestControlMaster runs several commands, some at once, over one
// connection the way OpenSSH multiplexes them.
func TestControlMaster(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	bare := h.repo("team/app", gittest.Shape{Commits: 3})
	// Unix socket paths are short: keep the control path out of the test's
	// long temporary directory names.
	ctlDir, err := os.MkdirTemp("", "pwcm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ctlDir) })
	mux := []string{"-o", "ControlMaster=auto", "-o", "ControlPath=" + ctlDir + "/%r@%h:%p", "-o", "ControlPersist=60"}
	sshCommand := h.sshCommand(h.aliceKey, mux...)
	control := func(op string) sshResult {
		cmd := exec.Command("ssh", append(h.sshOptions(h.aliceKey, "", mux...), "-p", h.port, "-O", op, "git@127.0.0.1")...)
		cmd.Env = h.env.Vars
		out, err := cmd.CombinedOutput()
		var exitErr *exec.ExitError
		if err != nil && !errors.As(err, &exitErr) {
			t.Fatal(err)
		}
		return sshResult{stdout: string(out), code: cmd.ProcessState.ExitCode()}
	}
	t.Cleanup(func() { control("exit") })
	git := func(dir string, args ...string) string {
		t.Helper()
		out, err := h.env.Run(dir, []string{sshCommand}, args...)
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	before := h.srv.accepted.Load()
	if out := git("", "ls-remote", h.url("team/app.git")); !strings.Contains(out, "refs/heads/main") {
		t.Fatalf("ls-remote: %s", out)
	}
	if r := control("check"); r.code != 0 {
		t.Fatalf("no control master after the first command: %s", r.stdout)
	}
	dir := filepath.Join(t.TempDir(), "work")
	git("", "clone", h.url("team/app.git"), dir)
	git(dir, "fetch", "origin")
	h.env.Git(dir, "commit", "--allow-empty", "-q", "-m", "over the master")
	git(dir, "push", "origin", "HEAD:refs/heads/muxed")
	if got, want := h.env.RevParse(bare, "muxed"), h.env.RevParse(dir, "HEAD"); got != want {
		t.Fatalf("pushed %s, server has %s", want, got)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Go(func() {
			out, err := h.env.Run("", []string{sshCommand}, "clone", "-q", h.url("team/app.git"), filepath.Join(dir+"-"+strconv.Itoa(i)))
			if err != nil {
				errs <- fmt.Errorf("concurrent clone %d: %v\n%s", i, err, out)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := h.srv.accepted.Load() - before; n != 1 {
		t.Fatalf("%d TCP connections for the multiplexed commands, want 1", n)
	}
	if r := control("check"); r.code != 0 {
		t.Fatalf("master gone after the commands: %s", r.stdout)
	}
	if r := control("exit"); r.code != 0 {
		t.Fatalf("ssh -O exit: %s", r.stdout)
	}
}

func TestBadCommands(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.repo("team/app", gittest.Shape{Commits: 1})
	for _, cmd := range []string{
		"git-upload-pack 'team/app.git'; id",
		"git-upload-pack '/team/app.git' | cat",
		"git-upload-pack $(id)",
		"git-upload-pack `id`",
		"git-upload-pack '/team/app.git' && id",
		"git-upload-pack '/team/app.git' extra",
		"git-upload-pack '/team/app.git",
		"git-upload-pack\n'/team/app.git'",
		"id",
		"scp -f /etc/passwd",
		"git-upload-pack",
	} {
		r := h.runSSH(h.aliceKey, cmd)
		if r.code != exitRefused || r.stdout != "" || r.stderr != invalidCommandRefusal {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d and one line %q", cmd, r.code, r.stdout, r.stderr, exitRefused, invalidCommandRefusal)
		}
	}

	for _, path := range []string{"'nope.git'", "'/team/nope.git'", "'../x'", "'/etc'", "'~/x'", "'team/../team/app.git'"} {
		r := h.runSSH(h.aliceKey, "git-upload-pack "+path)
		msg, _ := strings.CutPrefix(r.stderr, "fatal: ")
		ok := r.code == exitRefused && strings.HasPrefix(msg, "repository '") && strings.HasSuffix(msg, "' not found\n") &&
			strings.Count(r.stderr, "\n") == 1 && strings.HasSuffix(r.stdout, "ERR "+msg)
		if !ok {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %d and \"repository '...' not found\"", path, r.code, r.stdout, r.stderr, exitRefused)
		}
	}
	out, err := h.git("", h.aliceKey, "clone", h.url("team/nope.git"), filepath.Join(t.TempDir(), "nope"))
	if err == nil || !strings.Contains(out, "fatal: remote error: repository 'team/nope.git' not found") {
		t.Fatalf("clone of an unknown repository: err %v\n%s", err, out)
	}

	// The server is unharmed and still serves.
	if out := h.mustGit("", h.aliceKey, "ls-remote", h.url("team/app.git")); !strings.Contains(out, "refs/heads/main") {
		t.Fatalf("ls-remote after bad commands: %s", out)
	}
	if !strings.Contains(h.logs.String(), `reason="invalid command"`) {
		t.Fatalf("invalid commands not logged:\n%s", h.logs.String())
	}
}

func TestShellAndSessionRequestsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.repo("team/app", gittest.Shape{Commits: 1})
	// Without a terminal: the shell request gets a greeting saying who the
	// key makes the client, exit 1, as the big hosts do.
	const aliceGreeting = "Hi alice! You are authenticated to packwire; shell access is not provided.\n"
	if r := h.runSSH(h.aliceKey, "-T"); r.code != exitShell || r.stderr != aliceGreeting {
		t.Errorf("ssh -T: exit %d, stderr %q; want %d and %q", r.code, r.stderr, exitShell, aliceGreeting)
	}
	// A key nobody registered: anonymous, told so, with its fingerprint.
	fp := strings.TrimSpace(string(must(exec.Command("ssh-keygen", "-l", "-E", "sha256", "-f", h.anonKey+".pub").Output())))
	fp = strings.Fields(fp)[1]
	if r := h.runSSH(h.anonKey, "-T"); r.code != exitShell || !strings.Contains(r.stderr, "Your key "+fp+" is not registered with packwire") {
		t.Errorf("unregistered key: exit %d, stderr %q; want the fingerprint %s", r.code, r.stderr, fp)
	}
	// No key at all (keyboard-interactive): anonymous, told so.
	if r := h.runSSH("", "-T"); r.code != exitShell || !strings.Contains(r.stderr, "You offered no SSH key") {
		t.Errorf("no key: exit %d, stderr %q", r.code, r.stderr)
	}
	// -tt: the pty is refused, and OpenSSH gives up on a forced pty.
	if r := h.runSSH(h.aliceKey, "-tt"); r.code == 0 || !strings.Contains(r.stderr, "PTY allocation request failed") {
		t.Errorf("ssh -tt: exit %d, stderr %q; want a failure", r.code, r.stderr)
	}
	if r := h.runSSH(h.aliceKey, "-s", "sftp"); r.code == 0 {
		t.Errorf("sftp subsystem: exit 0")
	}

	// On the Go client: only GIT_PROTOCOL may be set, pty is refused, and
	// a second exec on the same channel is refused.
	client := h.dial(h.signer(h.aliceKey))
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.Setenv("LD_PRELOAD", "/tmp/x.so"); err == nil {
		t.Errorf("env LD_PRELOAD accepted")
	}
	if err := sess.Setenv("GIT_PROTOCOL", "version=2"); err != nil {
		t.Errorf("env GIT_PROTOCOL refused: %v", err)
	}
	if err := sess.RequestPty("xterm", 24, 80, nil); err == nil {
		t.Errorf("pty-req accepted")
	}
	if err := sess.RequestSubsystem("sftp"); err == nil {
		t.Errorf("subsystem accepted")
	}
	// What an interactive "ssh host" does after its pty was refused.
	var stderr bytes.Buffer
	sess.Stderr = &stderr
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	var exitErr *gossh.ExitError
	if err := sess.Wait(); !errors.As(err, &exitErr) || exitErr.ExitStatus() != exitShell || stderr.String() != aliceGreeting {
		t.Errorf("shell after a refused pty: %v, stderr %q", err, stderr.String())
	}

	// One command per channel: a second exec, or env once it runs, is refused.
	ch, reqs, err := client.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	go gossh.DiscardRequests(reqs)
	exec := gossh.Marshal(struct{ Command string }{"git-upload-pack '/team/app.git'"})
	if ok, err := ch.SendRequest("exec", true, exec); !ok || err != nil {
		t.Fatalf("exec: %v %v", ok, err)
	}
	if ok, _ := ch.SendRequest("exec", true, exec); ok {
		t.Errorf("second exec on one channel accepted")
	}
	if ok, _ := ch.SendRequest("env", true, gossh.Marshal(struct{ Name, Value string }{"GIT_PROTOCOL", "version=2"})); ok {
		t.Errorf("env accepted after exec")
	}
	pktline.WriteFlush(ch)
	if out, err := io.ReadAll(ch); err != nil || !bytes.Contains(out, []byte("refs/heads/main")) {
		t.Errorf("first exec: %v %q", err, out)
	}
}

// TestExitStatusBeforeEOF: the exit status reaches the client before EOF.
// An OpenSSH client closes a session channel once EOF went both ways; with
// the status after EOF its close could come first, x/crypto/ssh then drops
// the status, and a ControlMaster's mux client exits 255 on a complete
// fetch. x/crypto/ssh's client handles a channel's packets in order, so a
// status sent first is queued before Read returns EOF.
func TestExitStatusBeforeEOF(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.repo("team/app", gittest.Shape{Commits: 1})
	client := h.dial(h.signer(h.aliceKey))
	for i := range 10 {
		ch, reqs, err := client.OpenChannel("session", nil)
		if err != nil {
			t.Fatal(err)
		}
		exec := gossh.Marshal(struct{ Command string }{"git-upload-pack '/team/app.git'"})
		if ok, err := ch.SendRequest("exec", true, exec); !ok || err != nil {
			t.Fatalf("exec: %v %v", ok, err)
		}
		pktline.WriteFlush(ch) // ls-remote: the advertisement, then nothing wanted
		if _, err := io.ReadAll(ch); err != nil {
			t.Fatal(err)
		}
		select {
		case req := <-reqs:
			var st struct{ Status uint32 }
			if req.Type != "exit-status" || gossh.Unmarshal(req.Payload, &st) != nil || st.Status != 0 {
				t.Fatalf("session %d: first request after the data %q %v, want exit-status 0", i, req.Type, req.Payload)
			}
		default:
			t.Fatalf("session %d: EOF came before the exit status", i)
		}
		ch.Close()
	}
}

func TestForwardingRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)

	// -L: the client listens; each connection to it asks for a
	// direct-tcpip channel, which is refused with the reason.
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	localAddr := probe.Addr().String()
	probe.Close()
	_, localPort, _ := net.SplitHostPort(localAddr)
	cmd := exec.Command("ssh", append(h.sshOptions(h.aliceKey, "INFO", "-p", h.port, "-N", "-L", localPort+":127.0.0.1:"+h.port), "git@127.0.0.1")...)
	cmd.Env = h.env.Vars
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var local net.Conn
	if !waitFor(5*time.Second, func() bool { local, err = net.Dial("tcp", localAddr); return err == nil }) {
		t.Fatalf("ssh -L never listened: %v\n%s", err, stderr.String())
	}
	local.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := local.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("forwarded connection: read %d, %v; want EOF", n, err)
	}
	local.Close()
	if !waitFor(5*time.Second, func() bool {
		return strings.Contains(stderr.String(), "administratively prohibited: packwire: port forwarding is not supported")
	}) {
		t.Fatalf("client did not report the refusal:\n%s", stderr.String())
	}

	// -R: the tcpip-forward global request is refused.
	r := h.runSSH(h.aliceKey, "-N", "-o", "ExitOnForwardFailure=yes", "-R", "0:127.0.0.1:9")
	if r.code == 0 || !strings.Contains(r.stderr, "remote port forwarding failed") {
		t.Fatalf("ssh -R: exit %d, stderr %q", r.code, r.stderr)
	}
	if !strings.Contains(h.logs.String(), "channel=direct-tcpip") || !strings.Contains(h.logs.String(), "request=tcpip-forward") {
		t.Fatalf("forwarding refusals not logged:\n%s", h.logs.String())
	}
}

// gitProcesses lists this process's descendants working on repo (git's
// children, such as pack-objects, inherit its working directory).
func gitProcesses(repo string) []string {
	entries, _ := os.ReadDir("/proc")
	parent := map[int]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				parent[pid], _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
	}
	self := os.Getpid()
	var found []string
	for pid := range parent {
		descendant := false
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == self {
				descendant = true
				break
			}
		}
		if !descendant {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		if strings.Contains(string(cmdline), repo) || strings.HasPrefix(cwd, repo) {
			found = append(found, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		}
	}
	return found
}

// startUploadPack asks for everything on a v0 upload-pack stream and
// returns once the pack has started to flow.
func startUploadPack(t *testing.T, stdin io.Writer, stdout io.Reader) {
	t.Helper()
	r := pktline.NewReader(stdout)
	var want string
	for {
		kind, line, err := r.Read()
		if err != nil {
			t.Fatalf("reading the advertisement: %v", err)
		}
		if kind == pktline.Flush {
			break
		}
		if want == "" {
			want, _, _ = strings.Cut(string(line), " ")
		}
	}
	pktline.Writef(stdin, "want %s\n", want)
	pktline.WriteFlush(stdin)
	pktline.Writef(stdin, "done\n")
	if _, err := io.CopyN(io.Discard, stdout, 1<<20); err != nil {
		t.Fatalf("reading the first MiB of the pack: %v", err)
	}
}

func TestClientVanishesMidClone(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(s *Server) { s.KeepAlive = time.Second })
	big := h.repo("team/big", gittest.Shape{Commits: 3, Files: 30, BlobBytes: 1 << 20, Incompress: true})

	waitGone := func(t *testing.T, what string) {
		t.Helper()
		start := time.Now()
		if !waitFor(2*time.Second, func() bool { return len(gitProcesses(big)) == 0 }) {
			t.Fatalf("%s: git still running after 2s: %v", what, gitProcesses(big))
		}
		t.Logf("%s: git gone %v after the client", what, time.Since(start).Round(time.Millisecond))
	}

	t.Run("connection", func(t *testing.T) {
		cmd := h.sshCmd(h.aliceKey, "", "git-upload-pack '/team/big.git'")
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		startUploadPack(t, stdin, stdout)
		if len(gitProcesses(big)) == 0 {
			t.Fatal("no git process seen while the pack flows")
		}
		cmd.Process.Kill()
		cmd.Wait()
		waitGone(t, "ssh killed")
	})

	// ControlMaster's case: the channel closes, the connection stays.
	t.Run("channel", func(t *testing.T) {
		client := h.dial(h.signer(h.aliceKey))
		sess, err := client.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		stdin, _ := sess.StdinPipe()
		stdout, _ := sess.StdoutPipe()
		if err := sess.Start("git-upload-pack '/team/big.git'"); err != nil {
			t.Fatal(err)
		}
		startUploadPack(t, stdin, stdout)
		sess.Close()
		waitGone(t, "channel closed")

		// The same connection still serves.
		again, err := client.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		again.Stdin = strings.NewReader("0000") // no wants: upload-pack ends cleanly
		if out, err := again.Output("git-upload-pack '/team/big.git'"); err != nil || !bytes.Contains(out, []byte("refs/heads/main")) {
			t.Fatalf("second command on the connection: %v\n%q", err, out)
		}
	})
}

func TestKeepAlive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(s *Server) { s.KeepAlive = 200 * time.Millisecond })
	h.repo("team/app", gittest.Shape{Commits: 2})

	// OpenSSH answers the probes: nothing is cut.
	h.mustGit("", h.aliceKey, "clone", h.url("team/app.git"), filepath.Join(t.TempDir(), "app"))

	// A client that answers: still connected after many intervals.
	answering := h.dial(h.signer(h.aliceKey))
	// A client that never answers: closed after three missed probes.
	nc, err := net.Dial("tcp", "127.0.0.1:"+h.port)
	if err != nil {
		t.Fatal(err)
	}
	mute, chans, reqs, err := gossh.NewClientConn(nc, nc.RemoteAddr().String(), &gossh.ClientConfig{
		User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(h.signer(h.anonKey))}, HostKeyCallback: gossh.InsecureIgnoreHostKey(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	go func() {
		for range reqs { // read, never reply
		}
	}()
	go func() {
		for ch := range chans {
			ch.Reject(gossh.Prohibited, "")
		}
	}()
	closed := make(chan struct{})
	go func() { mute.Wait(); close(closed) }()
	start := time.Now()
	select {
	case <-closed:
		if d := time.Since(start); d < 500*time.Millisecond {
			t.Fatalf("mute client closed after %v, before three probes could be missed", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a client that never answers keepalives is still connected")
	}
	if _, _, err := answering.SendRequest("ping@packwire.test", true, nil); err != nil {
		t.Fatalf("answering client was disconnected: %v", err)
	}
	if !strings.Contains(h.logs.String(), `reason="keepalive unanswered"`) {
		t.Fatalf("keepalive close not logged:\n%s", h.logs.String())
	}
}

func TestInitTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(s *Server) { s.InitTimeout = time.Second })
	h.repo("team/app", gittest.Shape{Commits: 1})

	// Silent after TCP connect: the version banner, then closed.
	raw, err := net.Dial("tcp", "127.0.0.1:"+h.port)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(raw)
	if !strings.HasPrefix(string(got), ServerVersion+"\r\n") || err != nil {
		t.Fatalf("silent client: read %q, %v; want the banner, then EOF", got, err)
	}

	// Authenticated and then silent: closed too.
	idle := h.dial(h.signer(h.aliceKey))
	closed := make(chan struct{})
	go func() { idle.Wait(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		t.Fatal("an authenticated client that sends no command is still connected")
	}

	// Once a command ran, the connection may idle (ControlPersist does).
	client := h.dial(h.signer(h.aliceKey))
	run := func() {
		sess, err := client.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		sess.Stdin = strings.NewReader("0000")
		if out, err := sess.Output("git-upload-pack '/team/app.git'"); err != nil {
			t.Fatalf("upload-pack: %v\n%q", err, out)
		}
	}
	run()
	time.Sleep(1500 * time.Millisecond)
	run()
	if !strings.Contains(h.logs.String(), "no command within the init timeout") {
		t.Fatalf("init timeout not logged:\n%s", h.logs.String())
	}
}

func TestMaxConnections(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(s *Server) { s.MaxConnections = 1 })
	h.repo("team/app", gittest.Shape{Commits: 1})
	held := h.dial(h.signer(h.aliceKey))
	if out, err := h.git("", h.aliceKey, "ls-remote", h.url("team/app.git")); err == nil {
		t.Fatalf("second connection served over the limit:\n%s", out)
	}
	if !strings.Contains(h.logs.String(), "too many connections (max 1)") {
		t.Fatalf("refusal not logged:\n%s", h.logs.String())
	}
	held.Close()
	if !waitFor(2*time.Second, func() bool { return h.srv.open.Load() == 0 }) {
		t.Fatal("held connection never counted as closed")
	}
	h.mustGit("", h.aliceKey, "ls-remote", h.url("team/app.git"))
}

// TestCloseDrains: Close ends idle connections at once and leaves running
// requests to finish; Wait returns when they have.
func TestCloseDrains(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.repo("team/app", gittest.Shape{Commits: 1})
	idle := h.dial(h.signer(h.aliceKey))
	busy := h.dial(h.signer(h.aliceKey))
	sess, err := busy.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	stdin, _ := sess.StdinPipe()
	stdout, _ := sess.StdoutPipe()
	if err := sess.Start("git-upload-pack '/team/app.git'"); err != nil {
		t.Fatal(err)
	}
	advert := pktline.NewReader(stdout)
	for kind := pktline.Data; kind != pktline.Flush; {
		if kind, _, err = advert.Read(); err != nil {
			t.Fatal(err)
		}
	}
	// upload-pack now waits for the client's wants.
	h.srv.Close()
	idleClosed := make(chan struct{})
	go func() { idle.Wait(); close(idleClosed) }()
	select {
	case <-idleClosed:
	case <-time.After(3 * time.Second):
		t.Fatal("idle connection still open after Close")
	}
	waited := make(chan struct{})
	go func() { h.srv.Wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("Wait returned while a request was running")
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := busy.NewSession(); err == nil {
		t.Fatal("new session accepted after Close")
	}
	pktline.WriteFlush(stdin) // no wants: upload-pack exits 0
	if err := sess.Wait(); err != nil {
		t.Fatalf("running request after Close: %v", err)
	}
	// This client keeps its connection: the server waits lingerClose for
	// it to close first (closeAfterClient), then closes it.
	select {
	case <-waited:
	case <-time.After(lingerClose + 3*time.Second):
		t.Fatal("Wait did not return once the last request ended")
	}
}

func TestCiphers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		server         []string
		accept, refuse string
	}{
		{nil, "aes128-gcm@openssh.com", "aes128-cbc"},
		{nil, "aes128-ctr", "chacha20-poly1305@openssh.com"},
		{[]string{"aes256-ctr"}, "aes256-ctr", "aes128-gcm@openssh.com"},
	} {
		h := newHarness(t, func(s *Server) { s.Ciphers = tc.server })
		h.repo("team/app", gittest.Shape{Commits: 1})
		if out, err := h.env.Run("", []string{h.sshCommand(h.aliceKey, "-c", tc.accept)}, "ls-remote", h.url("team/app")); err != nil {
			t.Errorf("server ciphers %v, client %s: %v\n%s", tc.server, tc.accept, err, out)
		}
		if out, err := h.env.Run("", []string{h.sshCommand(h.aliceKey, "-c", tc.refuse)}, "ls-remote", h.url("team/app")); err == nil {
			t.Errorf("server ciphers %v, client %s: connected\n%s", tc.server, tc.refuse, out)
		}
		// Either side may notice first; the server logs a failed handshake.
		if !waitFor(2*time.Second, func() bool { return strings.Contains(h.logs.String(), `reason="handshake failed"`) }) {
			t.Errorf("server ciphers %v, client %s: refusal not logged\n%s", tc.server, tc.refuse, h.logs.String())
		}
	}
}

// TestDefaultCipherIsAES: the OpenSSH client with its own default cipher
// list negotiates AES with packwire's defaults, not chacha20-poly1305
// (which it prefers, and which costs the server ~5x more CPU per byte).
func TestDefaultCipherIsAES(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.repo("team/app", gittest.Shape{Commits: 1})
	cmd := h.sshCmd(h.aliceKey, "DEBUG1", "git-upload-pack", "team/app")
	cmd.Stdin = strings.NewReader("0000")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ssh: %v\n%s", err, out)
	}
	var chosen string
	for _, l := range strings.Split(string(out), "\n") {
		if i := strings.Index(l, "kex: server->client cipher: "); i >= 0 {
			chosen = l[i+len("kex: server->client cipher: "):]
		}
	}
	if !strings.HasPrefix(chosen, "aes") {
		t.Fatalf("negotiated %q, want an AES cipher\n%s", chosen, out)
	}
	t.Logf("OpenSSH's default choice: %s", chosen)
}

// TestClientEOFReachesGit: when the client closes its side of the channel,
// git reads EOF and ends; the session ends with an exit status.
func TestClientEOFReachesGit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.repo("team/app", gittest.Shape{Commits: 1})
	client := h.dial(h.signer(h.aliceKey))
	for _, service := range []string{"git-upload-pack", "git-receive-pack", "git-upload-archive"} {
		sess, err := client.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		stdin, _ := sess.StdinPipe()
		sess.Stdout = io.Discard
		if err := sess.Start(service + " '/team/app.git'"); err != nil {
			t.Fatal(err)
		}
		stdin.Close() // EOF on the channel, which stays open for git's answer
		done := make(chan error, 1)
		go func() { done <- sess.Wait() }()
		select {
		case err := <-done:
			var exitErr *gossh.ExitError
			if err != nil && !errors.As(err, &exitErr) {
				t.Errorf("%s: session ended without an exit status: %v", service, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: git did not end after the client's EOF", service)
		}
		sess.Close()
	}
}

// TestSilentPusher: a client that takes the push advertisement and then
// sends nothing (no commands, or commands and no pack when every ref is
// refused) is ended by the idle timeout, as a silent client of git is.
func TestSilentPusher(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.pipe.Runner.IdleTimeout = time.Second
	h.repo("team/app", gittest.Shape{Commits: 1})
	if _, err := h.data.Store.InsertRules(context.Background(), 0, store.Rule{Allow: false, Ops: "create", RepoPattern: "**", RefPattern: "**", Who: "*"}); err != nil {
		t.Fatal(err)
	}
	client := h.dial(h.signer(h.aliceKey))
	zero := strings.Repeat("0", 40)
	for _, send := range []string{
		"",
		pktLine(zero+" "+strings.Repeat("1", 40)+" refs/heads/new\x00report-status side-band-64k") + "0000", // refused; the pack never comes
	} {
		sess, err := client.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		stdin, _ := sess.StdinPipe()
		var out syncBuffer
		sess.Stdout = &out
		if err := sess.Start("git-receive-pack '/team/app.git'"); err != nil {
			t.Fatal(err)
		}
		if !waitFor(5*time.Second, func() bool { return strings.Contains(out.String(), "0000") }) {
			t.Fatalf("no advertisement: %q", out.String())
		}
		io.WriteString(stdin, send)
		done := make(chan error, 1)
		go func() { done <- sess.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("silent pusher (sent %q) not ended by the idle timeout", send)
		}
		sess.Close()
	}
}

func pktLine(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
