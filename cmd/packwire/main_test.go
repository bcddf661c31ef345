package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"packwire/internal/datadir"
	"packwire/internal/gittest"
	"packwire/internal/pgtest"
	"packwire/internal/s3test"
)

// binary is packwire, built once for every test here (TestMain). The
// cluster tests and the other long end-to-end ones run in parallel
// (t.Parallel), each with its own nodes, directories and database on the
// PostgreSQL the package shares (pgtest.Shared).
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "packwire-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "packwire")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		panic(string(out))
	}
	// The small reference-transaction hook next to it, as installed: the
	// node processes (the cluster's kill test) use it; the servers the
	// tests start in-process run this test binary as the hook instead.
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "packwire-hook"), "../packwire-hook").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := pgtest.Main(m)
	s3test.StopShared()
	os.RemoveAll(dir)
	os.Exit(code)
}

func packwire(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// newData makes a data directory with packwire init, as admin commands
// need one that exists.
func newData(t *testing.T) string {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	if out, code := packwire(t, "init", "--data", data); code != 0 {
		t.Fatalf("packwire init: %d %s", code, out)
	}
	return data
}

func TestAdminCommands(t *testing.T) {
	env := gittest.New(t)
	data := newData(t)
	// Flags may come after positional arguments.
	if out, code := packwire(t, "repo", "create", "team/app", "--data", data); code != 0 || !strings.Contains(out, "created team/app") {
		t.Fatalf("repo create: %d %s", code, out)
	}
	if out, code := packwire(t, "repo", "create", "team/app", "--data", data); code == 0 || !strings.Contains(out, "already exists") {
		t.Fatalf("duplicate repo create: %d %s", code, out)
	}
	if out, code := packwire(t, "repo", "create", "../evil", "--data", data); code == 0 || !strings.Contains(out, "invalid repository name") {
		t.Fatalf("bad name: %d %s", code, out)
	}
	src := filepath.Join(t.TempDir(), "src.git")
	env.Build(src, gittest.Shape{Commits: 5, Branches: 1, Tags: 1})
	if out, code := packwire(t, "--data", data, "repo", "import", "mirror", src); code != 2 {
		// the command must come first
		t.Fatalf("flags before the command: %d %s", code, out)
	}
	if out, code := packwire(t, "repo", "import", "--data", data, "team/mirror", src); code != 0 {
		t.Fatalf("repo import: %d %s", code, out)
	}
	imported := filepath.Join(data, "repos", "team", "mirror.git")
	if a, b := env.Git(src, "show-ref"), env.Git(imported, "show-ref"); a != b {
		t.Fatalf("import differs:\n%s\n%s", a, b)
	}
	if out, code := packwire(t, "repo", "import", "bad", filepath.Join(t.TempDir(), "missing"), "--data", data); code == 0 {
		t.Fatalf("import of a missing source succeeded: %s", out)
	}
	if _, err := os.Stat(filepath.Join(data, "repos", "bad.git")); err == nil {
		t.Fatal("failed import left a repository behind")
	}
	if out, _ := packwire(t, "repo", "list", "--data", data); out != "team/app\nteam/mirror\n" {
		t.Fatalf("repo list: %q", out)
	}

	keyFile := filepath.Join(t.TempDir(), "id.pub")
	os.WriteFile(keyFile, []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBfCe2DAk0Cfp5PnTQw9jhHcHShtEzUi2F2Pnbcy1uWl alice@laptop\n"), 0o644)
	if out, code := packwire(t, "user", "add", "alice", "--key", keyFile, "--data", data); code != 0 || !strings.Contains(out, "key SHA256:") {
		t.Fatalf("user add: %d %s", code, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.pub")
	os.WriteFile(bad, []byte("not a key"), 0o644)
	if out, code := packwire(t, "user", "add", "bob", "--key", bad, "--data", data); code == 0 || !strings.Contains(out, "not an SSH public key") {
		t.Fatalf("bad key: %d %s", code, out)
	}
	if out, _ := packwire(t, "user", "list", "--data", data); out != "alice\n" {
		t.Fatalf("a user with a bad key was added: %q", out)
	}

	out, code := packwire(t, "token", "create", "alice", "--data", data)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	token := lines[len(lines)-1]
	if code != 0 || !regexp.MustCompile(`^pwt_[0-9a-f]{16}_[A-Za-z0-9_-]{43}$`).MatchString(token) {
		t.Fatalf("token create: %d %q", code, out)
	}
	d, err := datadir.Open(context.Background(), data)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p, err := d.Access.PrincipalForToken(context.Background(), "alice", token)
	if err != nil || p.User != "alice" {
		t.Fatalf("token does not authenticate: %v %v", p, err)
	}
	db, _ := os.ReadFile(filepath.Join(data, "packwire.db"))
	wal, _ := os.ReadFile(filepath.Join(data, "packwire.db-wal"))
	// The secret is everything after pwt_<16 hex>_: it may itself hold
	// '_' (base64url), so not what follows the last one.
	secret := token[len("pwt_")+16+1:]
	if strings.Contains(string(db)+string(wal), secret) {
		t.Fatal("the token secret is stored in clear")
	}
	if out, code := packwire(t, "token", "create", "nobody", "--data", data); code == 0 || !strings.Contains(out, `no user "nobody"`) {
		t.Fatalf("token for unknown user: %d %s", code, out)
	}
	if out, code := packwire(t, "frobnicate"); code != 2 || !strings.Contains(out, "unknown command") {
		t.Fatalf("unknown command: %d %s", code, out)
	}
	if out, code := packwire(t, "serve", "--help"); code != 0 || !strings.Contains(out, "--max-connections") {
		t.Fatalf("serve --help: %d %s", code, out)
	}
}

// TestServeSignal runs the real binary on embedded defaults (in a fresh
// directory), starts a clone, sends SIGTERM mid-clone, and checks the clone
// completes and the server exits 0; a second start keeps the host keys.
func TestServeSignal(t *testing.T) {
	env := gittest.New(t)
	work := t.TempDir()
	data := filepath.Join(work, "packwire-data")
	if out, code := packwire(t, "init", "--data", data); code != 0 {
		t.Fatal(out)
	}
	if out, code := packwire(t, "repo", "create", "big", "--data", data); code != 0 {
		t.Fatal(out)
	}
	env.Build(filepath.Join(data, "repos", "big.git"), gittest.Shape{Commits: 2, Files: 30, BlobBytes: 1 << 20, Incompress: true})

	start := func() (*exec.Cmd, map[string]string, string) {
		cmd := exec.Command(binary, "serve", "--git", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ssh", "127.0.0.1:0", "--grace", "20s")
		cmd.Dir = work // embedded default: ./packwire-data
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		addrs := map[string]string{}
		var hostKeys []string
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`(git|http|ssh)://\s+listening on (\S+?),?(?: host key ssh-ed25519 (\S+))?$`)
		otherKey := regexp.MustCompile(`^\s+host key (ecdsa-sha2-nistp256|ssh-rsa) (\S+)$`)
		for (len(addrs) < 3 || len(hostKeys) < 3) && sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrs[m[1]] = m[2]
				if m[3] != "" {
					hostKeys = append(hostKeys, m[3])
				}
			} else if m := otherKey.FindStringSubmatch(sc.Text()); m != nil {
				hostKeys = append(hostKeys, m[1]+" "+m[2])
			}
		}
		go func() {
			for sc.Scan() {
			}
		}()
		if len(addrs) < 3 || len(hostKeys) < 3 {
			cmd.Process.Kill()
			t.Fatalf("serve did not print its addresses and three host keys: %v %v", addrs, hostKeys)
		}
		return cmd, addrs, strings.Join(hostKeys, ", ")
	}

	cmd, addrs, fp1 := start()
	clone := exec.Command("git", "clone", "--progress", "http://"+addrs["http"]+"/big", filepath.Join(work, "c"))
	clone.Env = env.Vars
	stderr, _ := clone.StderrPipe()
	clone.Start()
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "Receiving objects") || strings.Contains(sc.Text(), "remote:") {
			break
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	go func() {
		for sc.Scan() {
		}
	}()
	if err := clone.Wait(); err != nil {
		t.Fatalf("clone interrupted by graceful shutdown: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v, want 0", err)
		}
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		t.Fatal("serve did not exit after SIGTERM")
	}
	env.Fsck(filepath.Join(work, "c"))

	// The clone left a governor record that the CLI can read.
	out, code := packwire(t, "governor", "--data", data, "--by", "transport", "--json")
	if code != 0 || !strings.Contains(out, `"key": "http"`) {
		t.Fatalf("governor summary: %d %s", code, out)
	}
	out, code = packwire(t, "governor", "--data", data, "--last", "5")
	if code != 0 || !strings.Contains(out, "full-clone") || !strings.Contains(out, "result=ok") {
		t.Fatalf("governor --last: %d %s", code, out)
	}
	if out, code := packwire(t, "governor", "--data", data, "--by", "color"); code != 2 {
		t.Fatalf("bad --by: %d %s", code, out)
	}

	cmd, addrs2, fp2 := start()
	// governor tail follows records as they are written.
	tail := exec.Command(binary, "governor", "tail", "--data", data)
	tailOut, _ := tail.StdoutPipe()
	tail.Start()
	time.Sleep(500 * time.Millisecond)
	env.Git("", "ls-remote", "git://"+addrs2["git"]+"/big")
	line, _ := bufio.NewReader(tailOut).ReadString('\n')
	tail.Process.Signal(syscall.SIGINT)
	tail.Wait()
	if !strings.Contains(line, "no-op") || !strings.Contains(line, "git") {
		t.Fatalf("governor tail printed %q", line)
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve exited with %v after SIGINT", err)
	}
	if fp1 != fp2 {
		t.Fatalf("host keys changed across restarts: %s -> %s", fp1, fp2)
	}
}
