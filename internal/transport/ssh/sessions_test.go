package ssh

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/gittest"
	"packwire/internal/pktline"
)

// TestMaxSessionsPerConnection: one connection that opens 150 session
// channels gets 10, each of which may run a git; the rest are refused with
// a resource shortage and logged. A normal clone from another connection
// meanwhile goes through in well under 2 s, and a closed session frees its
// slot.
func TestMaxSessionsPerConnection(t *testing.T) {
	t.Parallel()
	const limit = 10
	h := newHarness(t, func(s *Server) { s.MaxSessions = limit })
	bare := h.repo("team/app", gittest.Shape{Commits: 3})
	flood := h.dial(h.signer(h.anonKey))
	wantRefusal := "packwire: too many sessions on this connection (max 10)"
	openSession := func() (gossh.Channel, error) {
		ch, reqs, err := flood.OpenChannel("session", nil)
		if err != nil {
			var refusal *gossh.OpenChannelError
			if !errors.As(err, &refusal) || refusal.Reason != gossh.ResourceShortage || refusal.Message != wantRefusal {
				t.Fatalf("channel open: %v, want a resource shortage %q", err, wantRefusal)
			}
			return nil, err
		}
		go gossh.DiscardRequests(reqs)
		return ch, nil
	}
	var sessions []gossh.Channel
	refused := 0
	for range 150 {
		if ch, err := openSession(); err == nil {
			sessions = append(sessions, ch)
		} else {
			refused++
		}
	}
	if len(sessions) != limit || refused != 150-limit {
		t.Fatalf("%d session channels accepted and %d refused on one connection, want %d and %d", len(sessions), refused, limit, 150-limit)
	}
	// Each accepted session runs an upload-pack that waits for its client.
	uploadPack := gossh.Marshal(struct{ Command string }{"git-upload-pack '/team/app.git'"})
	for i, ch := range sessions {
		if ok, err := ch.SendRequest("exec", true, uploadPack); !ok || err != nil {
			t.Fatalf("exec on session %d: %v %v", i, ok, err)
		}
	}
	if !waitFor(10*time.Second, func() bool { return len(gitProcesses(bare)) == limit }) {
		t.Fatalf("want %d git processes for the flooding connection, have %v", limit, gitProcesses(bare))
	}

	start := time.Now()
	h.mustGit("", h.aliceKey, "clone", "-q", h.url("team/app.git"), filepath.Join(t.TempDir(), "app"))
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a clone beside the flood took %v, want under 2s", took)
	}
	t.Logf("clone beside the flood: %v", time.Since(start).Round(time.Millisecond))
	if _, err := openSession(); err == nil {
		t.Fatal("a session over the limit was accepted after the clone")
	}
	if n := len(gitProcesses(bare)); n > limit {
		t.Fatalf("%d git processes, want at most %d", n, limit)
	}

	// A session that ends gives its slot back.
	pktline.WriteFlush(sessions[0]) // no wants: upload-pack exits 0
	sessions[0].Close()
	var again gossh.Channel
	if !waitFor(5*time.Second, func() bool { ch, err := openSession(); again = ch; return err == nil }) {
		t.Fatal("no session slot came free after a session ended")
	}
	again.Close()
	// Logged once per connection: a flood of opens is not a flood of lines.
	if n := strings.Count(h.logs.String(), `level=WARN msg=refused transport=ssh`); n != 1 || !strings.Contains(h.logs.String(), `reason="too many sessions on this connection (max 10)"`) {
		t.Fatalf("refusals logged %d times, want once:\n%s", n, h.logs.String())
	}
}

// TestIdleTimeout: a connection is closed once no command ran on it for
// IdleTimeout, never while a command runs however quiet; an OpenSSH
// ControlMaster whose connection was closed is replaced by a new one.
func TestIdleTimeout(t *testing.T) {
	t.Parallel()
	const idle = time.Second
	h := newHarness(t, func(s *Server) { s.IdleTimeout = idle })
	h.repo("team/app", gittest.Shape{Commits: 2})

	client := h.dial(h.signer(h.aliceKey))
	closed := make(chan struct{})
	go func() { client.Wait(); close(closed) }()
	sess, err := client.NewSession()
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
	// upload-pack now waits for wants: nothing moves, yet a command runs.
	select {
	case <-closed:
		t.Fatal("connection closed while a command ran")
	case <-time.After(3 * idle):
	}
	pktline.WriteFlush(stdin)
	if err := sess.Wait(); err != nil {
		t.Fatalf("command: %v", err)
	}
	ended := time.Now()
	select {
	case <-closed:
		if d := time.Since(ended); d < idle/2 {
			t.Fatalf("connection closed %v after its command ended, before the idle timeout %v", d, idle)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("connection still open 10s after its last command, idle timeout %v", idle)
	}
	if !strings.Contains(h.logs.String(), `reason="idle: no command running" timeout=1s`) {
		t.Fatalf("idle close not logged:\n%s", h.logs.String())
	}

	// OpenSSH ControlMaster with ControlPersist: the master ends with its
	// connection, and the next command starts a new one.
	ctlDir, err := os.MkdirTemp("", "pwidle") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ctlDir) })
	mux := []string{"-o", "ControlMaster=auto", "-o", "ControlPath=" + ctlDir + "/%r@%h:%p", "-o", "ControlPersist=60"}
	check := func() bool {
		cmd := exec.Command("ssh", append(h.sshOptions(h.aliceKey, "", mux...), "-p", h.port, "-O", "check", "git@127.0.0.1")...)
		cmd.Env = h.env.Vars
		return cmd.Run() == nil
	}
	t.Cleanup(func() {
		cmd := exec.Command("ssh", append(h.sshOptions(h.aliceKey, "", mux...), "-p", h.port, "-O", "exit", "git@127.0.0.1")...)
		cmd.Env = h.env.Vars
		cmd.Run()
	})
	lsRemote := func() {
		t.Helper()
		out, err := h.env.Run("", []string{h.sshCommand(h.aliceKey, mux...)}, "ls-remote", h.url("team/app.git"))
		if err != nil || !strings.Contains(out, "refs/heads/main") {
			t.Fatalf("ls-remote through the master: %v\n%s", err, out)
		}
	}
	before := h.srv.accepted.Load()
	lsRemote()
	if !check() {
		t.Fatal("no control master after the first command")
	}
	if !waitFor(10*time.Second, func() bool { return !check() }) {
		t.Fatal("the master's connection outlived the idle timeout")
	}
	lsRemote()
	if n := h.srv.accepted.Load() - before; n != 2 {
		t.Fatalf("%d connections for two commands around an idle close, want 2", n)
	}
}
