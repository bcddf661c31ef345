package server

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/pktline"
)

// badHeads are length prefixes no packet has: not hex, too short for a
// packet, longer than any.
var badHeads = []string{"zzzz", "0003", "fff1", "ffff"}

// waitSessionsEnd waits until no request runs, and fails the test if one
// still does after within.
func (s *testServer) waitSessionsEnd(t *testing.T, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for len(s.Pipeline.Active()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sessions still running %v after the client left: %+v (git started %d times)", within, s.Pipeline.Active(), s.Pipeline.GitStarts())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMalformedV2SessionEnds: a protocol v2 session over git:// or SSH
// whose client sends a length prefix no packet has gets git's error
// ("protocol error: bad line length ...") and is closed, having started
// no git for it; one whose client leaves right after sending it ends too.
// On the old server the session peeked the same 4 bytes forever and
// started a git with an empty request each time: about 70 a second over
// git://, after the client had gone.
func TestMalformedV2SessionEnds(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, func(c *Config) {
		enableSSH(c)
		c.PenaltyMax = 0 // one address sends every bad packet: TestPenaltyRefusesAtAccept
	})
	sshEnvFor(s) // registers alice's key
	s.seed(t, "team/app")
	for _, head := range badHeads {
		want := "protocol error: bad line length"
		t.Run("git/"+head, func(t *testing.T) {
			conn := s.dialV2(t)
			before := s.Pipeline.GitStarts()
			conn.Write([]byte(head))
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, _ := io.ReadAll(conn) // to the server's close
			if !strings.Contains(string(got), "ERR "+want) {
				t.Fatalf("got %q, want an ERR %q and the connection closed", got, want)
			}
			s.waitSessionsEnd(t, 5*time.Second)
			if n := s.Pipeline.GitStarts() - before; n != 0 {
				t.Fatalf("%d gits started for a malformed packet", n)
			}
		})
		t.Run("git/"+head+"/client gone", func(t *testing.T) {
			conn := s.dialV2(t)
			before := s.Pipeline.GitStarts()
			conn.Write([]byte(head))
			conn.Close()
			s.waitSessionsEnd(t, 5*time.Second)
			if n := s.Pipeline.GitStarts() - before; n != 0 {
				t.Fatalf("%d gits started for a malformed packet", n)
			}
		})
		t.Run("ssh/"+head, func(t *testing.T) {
			sess, stdin, stdout, stderr, done := s.sshExec(t, "version=2", "git-upload-pack 'team/app'")
			defer done()
			readAdvertisement(t, stdout)
			before := s.Pipeline.GitStarts()
			stdin.Write([]byte(head))
			out := make(chan []byte, 1)
			go func() { b, _ := io.ReadAll(stdout); out <- b }()
			var got []byte
			select {
			case got = <-out:
			case <-time.After(10 * time.Second):
				t.Fatalf("the session is still open 10s after a malformed packet (git started %d times)", s.Pipeline.GitStarts()-before)
			}
			err := sess.Wait()
			exit, _ := err.(*gossh.ExitError)
			if !strings.Contains(string(got), "ERR "+want) || exit == nil || exit.ExitStatus() != 128 || !strings.Contains(stderr.String(), "fatal: "+want) {
				t.Fatalf("stdout %q, stderr %q, exit %v; want git's error and status 128", got, stderr.String(), err)
			}
			s.waitSessionsEnd(t, 5*time.Second)
			if n := s.Pipeline.GitStarts() - before; n != 0 {
				t.Fatalf("%d gits started for a malformed packet", n)
			}
		})
	}
}

// dialV2 opens a git:// protocol v2 upload-pack session of team/app and
// reads the capability advertisement.
func (s *testServer) dialV2(t *testing.T) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", s.GitAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.Write(request("git-upload-pack", "/team/app", "\x00version=2\x00"))
	readAdvertisement(t, conn)
	return conn
}

// readAdvertisement reads pkt-lines up to the first flush.
func readAdvertisement(t *testing.T, r io.Reader) {
	t.Helper()
	pr := pktline.NewReader(r)
	for {
		kind, _, err := pr.Read()
		if err != nil {
			t.Fatalf("advertisement: %v", err)
		}
		if kind == pktline.Flush {
			return
		}
	}
}

// sshExec runs command in an SSH session as alice (withSSH's key), with
// GIT_PROTOCOL set to gitProtocol unless empty.
func (s *testServer) sshExec(t *testing.T, gitProtocol, command string) (*gossh.Session, io.WriteCloser, io.Reader, *strings.Builder, func()) {
	t.Helper()
	return sshExecWith(t, s.SSHAddr.String(), filepath.Join(s.env.Home, "id_ed25519"), gitProtocol, command)
}

// sshExecWith runs command in an SSH session at addr with the private key
// in keyFile (the Go client: the test controls every byte).
func sshExecWith(t *testing.T, addr, keyFile, gitProtocol, command string) (*gossh.Session, io.WriteCloser, io.Reader, *strings.Builder, func()) {
	t.Helper()
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.ParsePrivateKey(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	client, err := gossh.Dial("tcp", addr, &gossh.ClientConfig{User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
		HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if gitProtocol != "" {
		if err := sess.Setenv("GIT_PROTOCOL", gitProtocol); err != nil {
			t.Fatal(err)
		}
	}
	stdin, _ := sess.StdinPipe()
	stdout, _ := sess.StdoutPipe()
	stderr := &strings.Builder{}
	sess.Stderr = stderr
	if err := sess.Start(command); err != nil {
		t.Fatal(err)
	}
	return sess, stdin, stdout, stderr, func() { sess.Close(); client.Close() }
}
