//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/handover"
	"packwire/internal/server"
)

// TestSystemdSocketActivate starts the binary under systemd's own
// socket-activation tool (systemd-socket-activate, which binds the
// sockets, waits for a first connection and execs packwire with
// LISTEN_FDS): one socket named "git" (serve's --git points elsewhere: the
// name decides) and two sharing one name, as a single socket unit's do
// (matched by port). The connection that woke it waits in the backlog and
// is served; git:// and HTTP clone and SSH greets on the inherited sockets.
// Then SIGHUP with a new max-requests-per-client in the config file: the
// same process refuses a request over the new limit while a request
// opened before the reload goes on and ends cleanly.
func TestSystemdSocketActivate(t *testing.T) {
	tool, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Skip("systemd-socket-activate is not installed")
	}
	env := gittest.New(t)
	work := t.TempDir()
	data := filepath.Join(work, "data")
	for _, args := range [][]string{{"init", "--data", data}, {"repo", "create", "r", "--data", data}} {
		if out, code := packwire(t, args...); code != 0 {
			t.Fatal(out)
		}
	}
	env.Build(filepath.Join(data, "repos", "r.git"), gittest.Shape{Commits: 3})
	config := filepath.Join(work, "packwire.toml")
	os.WriteFile(config, []byte("max-requests-per-client = 0\n"), 0o644)
	logFile := filepath.Join(work, "serve.out")

	var cmd *exec.Cmd
	var addrs []string
	exited := make(chan error, 1)
	// The ports are picked free, then bound by the tool: another process
	// may take one in between, so a failed bind picks again.
	for attempt := 0; ; attempt++ {
		addrs = freePorts(t, 3)
		out, _ := os.Create(logFile)
		cmd = exec.Command(tool,
			"-l", addrs[0], "-l", addrs[1], "-l", addrs[2],
			"--fdname=git:packwire.socket:packwire.socket",
			binary, "serve", "--data", data, "--config", config,
			"--git", "127.0.0.1:1", "--http", addrs[1], "--ssh", addrs[2])
		cmd.Stdout, cmd.Stderr = out, out
		dieWithTest(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		out.Close()
		go func() { exited <- cmd.Wait() }()
		if waitLogOrExit(t, logFile, "as 5.", exited) {
			break
		}
		if attempt == 2 {
			b, _ := os.ReadFile(logFile)
			t.Fatalf("systemd-socket-activate did not listen:\n%s", b)
		}
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	}()
	// The first connection starts packwire; it waits in the backlog.
	for _, url := range []string{"git://" + addrs[0] + "/r", "http://" + addrs[1] + "/r"} {
		dir := filepath.Join(work, "clone-"+url[:3])
		if out, err := env.Run("", nil, "clone", "-q", "--no-checkout", url, dir); err != nil {
			b, _ := os.ReadFile(logFile)
			t.Fatalf("clone %s on an inherited socket: %v\n%s\n%s", url, err, out, b)
		}
	}
	c, err := net.DialTimeout("tcp", addrs[2], time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(time.Minute)) // a safety net
	if banner, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(banner, "SSH-2.0-") {
		t.Fatalf("SSH on the inherited socket: %q %v", banner, err)
	}
	c.Close()
	waitLog(t, logFile, "from=systemd sockets=3")
	pid := cmd.Process.Pid // the tool execs packwire in its place
	waitPID(t, handover.PIDFile(data), pid)

	// A request held open (upload-pack, waiting for the client's wants
	// after its advertisement) and a second one from the same address.
	held := openUploadPack(t, addrs[0])
	defer held.Close()
	if out, err := env.Run("", nil, "ls-remote", "git://"+addrs[0]+"/r"); err != nil {
		t.Fatalf("a second request without a per-client limit: %v\n%s", err, out)
	}
	os.WriteFile(config, []byte("max-requests-per-client = 1\n"), 0o644)
	cmd.Process.Signal(syscall.SIGHUP)
	waitLog(t, logFile, "applied=max-requests-per-client")
	out, err := env.Run("", nil, "ls-remote", "git://"+addrs[0]+"/r")
	if err == nil || !strings.Contains(out, "too many concurrent requests") {
		t.Fatalf("a second request over the reloaded limit of 1: %v\n%s", err, out)
	}
	// The held request ends as a client without wants ends it: a flush,
	// then the server closes cleanly.
	if _, err := io.WriteString(held, "0000"); err != nil {
		t.Fatalf("the request opened before the reload: %v", err)
	}
	if rest, err := io.ReadAll(held); err != nil || len(rest) != 0 {
		t.Fatalf("the request opened before the reload ended with %q %v", rest, err)
	}
	if now, err := handover.ReadPID(handover.PIDFile(data)); err != nil || now != pid || !handover.Alive(pid) {
		t.Fatalf("the reload of a limit replaced the process %d: %d %v", pid, now, err)
	}
}

// openUploadPack sends a git:// upload-pack request and reads the ref
// advertisement: the request then waits for the client's wants.
func openUploadPack(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(2 * time.Minute)) // a safety net
	line := "git-upload-pack /r\x00host=localhost\x00"
	fmt.Fprintf(c, "%04x%s", len(line)+4, line)
	r := bufio.NewReader(c)
	for {
		var size [4]byte
		if _, err := io.ReadFull(r, size[:]); err != nil {
			t.Fatalf("advertisement: %v", err)
		}
		n, err := strconv.ParseUint(string(size[:]), 16, 16)
		if err != nil {
			t.Fatalf("advertisement: pkt-line length %q", size)
		}
		if n == 0 {
			return c
		}
		if _, err := io.CopyN(io.Discard, r, int64(n)-4); err != nil {
			t.Fatalf("advertisement: %v", err)
		}
	}
}

// freePorts returns n addresses on 127.0.0.1 free a moment ago.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}

// waitLogOrExit waits for want in the log file; false if the process
// exits first.
func waitLogOrExit(t *testing.T, log, want string, exited chan error) bool {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(log); strings.Contains(string(b), want) {
			return true
		}
		select {
		case err := <-exited:
			exited <- err
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	b, _ := os.ReadFile(log)
	t.Fatalf("the log never said %q:\n%s", want, b)
	return false
}

func waitLog(t *testing.T, log, want string) {
	t.Helper()
	never := make(chan error)
	waitLogOrExit(t, log, want, never)
}

// TestSystemdUnitsVerify runs systemd-analyze verify on docs/packwire.socket
// and docs/packwire.service (the service's binary path replaced by one
// that exists here: verify checks it is executable), and checks that the
// socket unit listens on serve's default ports, which packwire matches
// its sockets by.
func TestSystemdUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	dir := t.TempDir()
	exe, err := exec.LookPath("true")
	if err != nil {
		t.Skip(err)
	}
	socket, err := os.ReadFile("../../docs/packwire.socket")
	if err != nil {
		t.Fatal(err)
	}
	service, err := os.ReadFile("../../docs/packwire.service")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "packwire.socket"), socket, 0o644)
	os.WriteFile(filepath.Join(dir, "packwire.service"), []byte(strings.ReplaceAll(string(service), "/usr/local/bin/packwire", exe)), 0o644)
	verify := exec.Command(analyze, "verify", filepath.Join(dir, "packwire.socket"), filepath.Join(dir, "packwire.service"))
	if out, err := verify.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	var ports []string
	for _, m := range regexp.MustCompile(`(?m)^ListenStream=(\S+)$`).FindAllStringSubmatch(string(socket), -1) {
		ports = append(ports, m[1])
	}
	d := server.Defaults
	var want []string
	for _, addr := range []string{d.GitAddr, d.HTTPAddr, d.SSHAddr} {
		_, port, _ := net.SplitHostPort(addr)
		want = append(want, port)
	}
	if strings.Join(ports, " ") != strings.Join(want, " ") {
		t.Fatalf("packwire.socket listens on %v; serve's default ports are %v", ports, want)
	}
}
