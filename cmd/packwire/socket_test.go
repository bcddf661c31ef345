//go:build unix

package main

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/handover"
)

// TestSocketActivationAndReload starts the binary as systemd's socket
// activation does (LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES; descriptors from
// 3): a named socket (git) and an unnamed one matched by its port (http)
// serve, though nothing else listens there. Then SIGHUP after the config
// file changed: a limit, --init-timeout and a larger --fetch-cache-max-bytes
// are applied in place (same pid): a git:// connection that sends nothing
// is now closed after the new 1s, and the response the fetch cache stored
// before is still there (the same file); a smaller bound then evicts it,
// still in place. A listen address is refused, and the server goes on
// serving.
func TestSocketActivationAndReload(t *testing.T) {
	env := gittest.New(t)
	work := t.TempDir()
	data := filepath.Join(work, "data")
	for _, args := range [][]string{{"init", "--data", data}, {"repo", "create", "r", "--data", data}} {
		if out, code := packwire(t, args...); code != 0 {
			t.Fatal(out)
		}
	}
	env.Build(filepath.Join(data, "repos", "r.git"), gittest.Shape{Commits: 3})
	var files []*os.File
	var addrs []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		f, _ := l.(*net.TCPListener).File()
		l.Close() // the descriptor in f keeps the socket listening
		files, addrs = append(files, f), append(addrs, l.Addr().String())
	}
	config := filepath.Join(work, "packwire.toml")
	os.WriteFile(config, []byte("max-pack-jobs = 8\ninit-timeout = \"1h\"\nfetch-cache-max-bytes = 10_000_000\n"), 0o644)
	logFile := filepath.Join(work, "serve.out")
	out, _ := os.Create(logFile)
	defer out.Close()
	// sh's $$ is the pid serve keeps across exec, as systemd sets it.
	cmd := exec.Command("sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, binary, "serve", "--data", data, "--config", config,
		"--git", "127.0.0.1:1", "--http", addrs[1], "--ssh", "")
	cmd.Env = append(os.Environ(), "LISTEN_FDS=2", "LISTEN_FDNAMES=git:")
	cmd.ExtraFiles = files
	cmd.Stdout, cmd.Stderr = out, out
	dieWithTest(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		f.Close()
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	}()
	waitPID(t, handover.PIDFile(data), cmd.Process.Pid)
	for _, url := range []string{"git://" + addrs[0] + "/r", "http://" + addrs[1] + "/r"} {
		if _, err := env.Run("", nil, "ls-remote", url); err != nil {
			b, _ := os.ReadFile(logFile)
			t.Fatalf("ls-remote %s on an inherited socket: %v\n%s", url, err, b)
		}
	}
	waitLog := func(want string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			b, _ := os.ReadFile(logFile)
			if strings.Contains(string(b), want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the log never said %q:\n%s", want, b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitLog("from=systemd sockets=2")
	// A clone over HTTP leaves its response in this process's fetch cache.
	if _, err := env.Run("", nil, "clone", "--bare", "http://"+addrs[1]+"/r", filepath.Join(work, "clone.git")); err != nil {
		t.Fatal(err)
	}
	responses := filepath.Join(data, "cache", "fetch", strconv.Itoa(cmd.Process.Pid), "*.response")
	var stored os.FileInfo
	waitUntil(t, time.Minute, "the clone's response in the fetch cache", func() bool {
		names, _ := filepath.Glob(responses)
		if len(names) == 1 {
			stored, _ = os.Stat(names[0])
		}
		return stored != nil
	})

	os.WriteFile(config, []byte("max-pack-jobs = 3\ninit-timeout = \"1s\"\nfetch-cache-max-bytes = 20_000_000\n"), 0o644)
	cmd.Process.Signal(syscall.SIGHUP)
	waitLog("applied=fetch-cache-max-bytes,init-timeout,max-pack-jobs")
	silent, err := net.Dial("tcp", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	silent.SetDeadline(time.Now().Add(time.Minute)) // a safety net: the server closes it after 1s
	_, err = io.ReadAll(silent)
	silent.Close()
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a git:// connection that sent nothing was not closed after the reloaded --init-timeout of 1s")
	}
	names, _ := filepath.Glob(responses)
	if len(names) != 1 {
		t.Fatalf("the fetch cache after a larger bound: %v, want the response stored before the reload", names)
	}
	if now, err := os.Stat(names[0]); err != nil || !os.SameFile(now, stored) {
		t.Fatalf("the fetch cache's response was replaced by the reload: %v", err)
	}
	os.WriteFile(config, []byte("max-pack-jobs = 3\ninit-timeout = \"1s\"\nfetch-cache-max-bytes = 1\n"), 0o644)
	cmd.Process.Signal(syscall.SIGHUP)
	waitLog("applied=fetch-cache-max-bytes\n")
	if names, _ := filepath.Glob(responses); len(names) != 0 {
		t.Fatalf("the fetch cache kept %v past a bound of 1 byte", names)
	}
	os.WriteFile(config, []byte("max-pack-jobs = 3\nmetrics = \"127.0.0.1:0\"\n"), 0o644)
	cmd.Process.Signal(syscall.SIGHUP)
	waitLog("--metrics: a new value needs packwire stopped and started")
	if pid, err := handover.ReadPID(handover.PIDFile(data)); err != nil || pid != cmd.Process.Pid {
		t.Fatalf("a reload of limits, timeouts and cache bounds changed the serving process: %d %v", pid, err)
	}
	if _, err := env.Run("", nil, "ls-remote", "git://"+addrs[0]+"/r"); err != nil {
		t.Fatalf("after the reloads: %v", err)
	}
}
