package ssh

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/gittest"
	"packwire/internal/store"
)

// controlMaster is an OpenSSH ControlMaster to the harness's server with
// key: git and ssh commands through it share one connection.
type controlMaster struct {
	h   *harness
	key string
	mux []string
}

func newControlMaster(t *testing.T, h *harness, key string) *controlMaster {
	// Unix socket paths are short: keep the control path out of the
	// test's long temporary directory names.
	dir, err := os.MkdirTemp("", "pwcm")
	if err != nil {
		t.Fatal(err)
	}
	m := &controlMaster{h: h, key: key, mux: []string{"-o", "ControlMaster=auto", "-o", "ControlPath=" + dir + "/%r@%h:%p", "-o", "ControlPersist=60"}}
	t.Cleanup(func() {
		m.ssh("-O", "exit")
		os.RemoveAll(dir)
	})
	return m
}

// ssh runs the OpenSSH client through the master with args; it returns
// the combined output and the exit code.
func (m *controlMaster) ssh(args ...string) (string, int) {
	m.h.t.Helper()
	cmd := exec.Command("ssh", append(m.h.sshOptions(m.key, "", m.mux...), append([]string{"-p", m.h.port, "git@127.0.0.1"}, args...)...)...)
	cmd.Env = m.h.env.Vars
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		m.h.t.Fatal(err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

func (m *controlMaster) git(dir string, args ...string) (string, error) {
	return m.h.env.Run(dir, []string{m.h.sshCommand(m.key, m.mux...)}, args...)
}

// alive reports whether the server still has the master's connection as
// user. (Not ssh -O check: when it finds a master on its way out it
// connects on its own, and with ControlMaster=auto stays as a new master.)
func (m *controlMaster) alive(user string) bool {
	m.h.srv.mu.Lock()
	defer m.h.srv.mu.Unlock()
	for c := range m.h.srv.conns {
		if c.principal.User == user {
			return true
		}
	}
	return false
}

// TestRemovedKeyEndsConnection: with an OpenSSH ControlMaster open as kim,
// removing kim's key (or kim) refuses the next command over the master,
// a push and the greeting alike, before any git runs, and closes the
// connection once that command is over; a new connection is anonymous. A
// master that runs no command is closed once the store changed. Before,
// the push over the master was accepted and the greeting said "Hi kim!"
// for as long as the master lived.
func TestRemovedKeyEndsConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		remove func(h *harness, fingerprint string) error
	}{
		{"key removed", func(h *harness, fp string) error {
			_, err := h.data.Store.RemoveKey(context.Background(), fp)
			return err
		}},
		{"user removed", func(h *harness, fp string) error { return h.data.Store.RemoveUser(context.Background(), "kim") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Per command: the watch of idle connections is off (an hour).
			h := newHarness(t, func(s *Server) { s.KeyRecheck = time.Hour })
			bare := h.repo("team/app", gittest.Shape{Commits: 3})
			key, fp := addKim(t, h)
			m := newControlMaster(t, h, key)
			dir := filepath.Join(t.TempDir(), "work")
			if out, err := m.git("", "clone", "-q", h.url("team/app.git"), dir); err != nil {
				t.Fatalf("clone as kim: %v\n%s", err, out)
			}
			if out, _ := m.ssh(); !strings.Contains(out, "Hi kim!") {
				t.Fatalf("greeting over the master: %q", out)
			}
			before := h.srv.accepted.Load()
			if err := tc.remove(h, fp); err != nil {
				t.Fatal(err)
			}
			h.env.Git(dir, "commit", "--allow-empty", "-q", "-m", "after the key went")
			out, err := m.git(dir, "push", "origin", "HEAD:refs/heads/after")
			if err == nil || !strings.Contains(out, "is no longer registered to kim") {
				t.Fatalf("push over the master after %s: %v\n%s", tc.name, err, out)
			}
			if n := h.srv.accepted.Load() - before; n != 0 {
				t.Fatalf("the push opened %d new connections: it was not refused over the master", n)
			}
			if got := h.env.Git(bare, "for-each-ref", "refs/heads/after"); got != "" {
				t.Fatalf("the push landed: %s", got)
			}
			if !waitFor(10*time.Second, func() bool { return !m.alive("kim") }) {
				t.Fatal("the master's connection is still open after its key was refused")
			}
			if out, _ := m.ssh(); !strings.Contains(out, "is not registered with packwire") {
				t.Fatalf("greeting on a new connection: %q", out)
			}
		})
	}
	t.Run("idle master", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, func(s *Server) { s.KeyRecheck = 50 * time.Millisecond })
		h.repo("team/app", gittest.Shape{Commits: 1})
		key, fp := addKim(t, h)
		m := newControlMaster(t, h, key)
		if out, err := m.git("", "ls-remote", h.url("team/app.git")); err != nil {
			t.Fatalf("ls-remote as kim: %v\n%s", err, out)
		}
		// The store changes in other ways: the master stays.
		if _, err := h.data.Store.AddUser(context.Background(), "lee"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // safety margin: several rechecks
		if !m.alive("kim") {
			t.Fatal("the master was closed though kim's key stands")
		}
		if _, err := h.data.Store.RemoveKey(context.Background(), fp); err != nil {
			t.Fatal(err)
		}
		if !waitFor(10*time.Second, func() bool { return !m.alive("kim") }) {
			t.Fatal("an idle master whose key was removed is still open")
		}
		if !strings.Contains(h.logs.String(), "is no longer registered to kim") {
			t.Fatalf("no log line says why the connection closed:\n%s", h.logs.String())
		}
	})
}

// addKim registers user kim with a key and write everywhere.
func addKim(t *testing.T, h *harness) (key, fingerprint string) {
	t.Helper()
	ctx := context.Background()
	if _, err := h.data.Store.AddUser(ctx, "kim"); err != nil {
		t.Fatal(err)
	}
	if err := h.data.Store.SetGrant(ctx, store.Grant{User: "kim", RepoPattern: "**", Role: "write"}); err != nil {
		t.Fatal(err)
	}
	key = h.newKey("kim_key")
	h.register("kim", key)
	text, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	pub, _, _, _, err := gossh.ParseAuthorizedKey(text)
	if err != nil {
		t.Fatal(err)
	}
	return key, gossh.FingerprintSHA256(pub)
}

// TestKeyChangingHandsEndsConnection: a key that moves to another user, or
// an unregistered key that gets registered, no longer stands for who the
// connection authenticated as: its next command is refused with why, and
// the connection closes; a new connection is the key's new owner.
func TestKeyChangingHandsEndsConnection(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(s *Server) { s.KeyRecheck = time.Hour }) // per command only
	h.repo("team/app", gittest.Shape{Commits: 1})
	ctx := context.Background()
	if _, err := h.data.Store.AddUser(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	greet := func(client *gossh.Client) (string, error) {
		sess, err := client.NewSession()
		if err != nil {
			return "", err
		}
		defer sess.Close()
		// Two buffers: x/crypto copies stdout and stderr at once, and two
		// bytes.Buffer.ReadFrom on one buffer lose each other's bytes.
		var out, errOut bytes.Buffer
		sess.Stdout, sess.Stderr = &out, &errOut
		if err := sess.Shell(); err != nil {
			return "", err
		}
		err = sess.Wait()
		return out.String() + errOut.String(), err
	}
	for _, tc := range []struct {
		name, key, was, want, now string
		change                    func(fp string)
	}{
		{"moved", h.aliceKey, "Hi alice!", "now belongs to bob, not alice", "Hi bob!", func(fp string) {
			if _, err := h.data.Store.RemoveKey(ctx, fp); err != nil {
				t.Fatal(err)
			}
			h.register("bob", h.aliceKey)
		}},
		{"registered", h.anonKey, "is not registered", "is now registered to bob", "Hi bob!", func(string) { h.register("bob", h.anonKey) }},
	} {
		signer := h.signer(tc.key)
		client := h.dial(signer)
		if out, _ := greet(client); !strings.Contains(out, tc.was) {
			t.Fatalf("%s: greeting before: %q", tc.name, out)
		}
		tc.change(gossh.FingerprintSHA256(signer.PublicKey()))
		if out, _ := greet(client); !strings.Contains(out, tc.want+"; connect again") {
			t.Fatalf("%s: greeting on the same connection after the change: %q", tc.name, out)
		}
		if !waitFor(10*time.Second, func() bool { _, err := client.NewSession(); return err != nil }) {
			t.Fatalf("%s: the connection still opens sessions", tc.name)
		}
		if out, _ := greet(h.dial(signer)); !strings.Contains(out, tc.now) {
			t.Fatalf("%s: greeting on a new connection: %q", tc.name, out)
		}
	}
}
