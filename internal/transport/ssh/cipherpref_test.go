package ssh

import (
	"bytes"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/gittest"
)

// negotiatedCipher runs the OpenSSH client (with extra options) against h
// and returns the server->client cipher it reports choosing.
func negotiatedCipher(t *testing.T, h *harness, extra ...string) string {
	t.Helper()
	args := append(h.sshOptions(h.aliceKey, "DEBUG1", append(extra, "-p", h.port, "git@127.0.0.1")...), "git-upload-pack", "team/app")
	cmd := exec.Command("ssh", args...)
	cmd.Env = h.env.Vars
	cmd.Stdin = strings.NewReader("0000")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ssh %v: %v\n%s", extra, err, out)
	}
	chosen := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		for _, dir := range []string{"server->client", "client->server"} {
			if i := strings.Index(l, "kex: "+dir+" cipher: "); i >= 0 {
				chosen[dir] = strings.Fields(l[i+len("kex: "+dir+" cipher: "):])[0]
			}
		}
	}
	if chosen["server->client"] != chosen["client->server"] {
		t.Fatalf("ssh %v: ciphers differ by direction: %v\n%s", extra, chosen, out)
	}
	return chosen["server->client"]
}

// TestServerCipherOrder: on a near connection the server's cipher order
// decides, not the client's: the OpenSSH client, which lists aes128-ctr
// before aes128-gcm@openssh.com, gets AES-GCM (it got aes128-ctr with
// HMAC-SHA2-256 before); a client listing only AES-CTR still gets it, and
// a client's list in another order gets the server's first choice in it.
func TestServerCipherOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.repo("team/app", gittest.Shape{Commits: 1})
	for _, tc := range []struct {
		client []string
		want   string
	}{
		{nil, "aes128-gcm@openssh.com"},
		{[]string{"-c", "aes128-ctr,aes256-gcm@openssh.com"}, "aes256-gcm@openssh.com"},
		{[]string{"-c", "aes256-ctr,aes128-ctr"}, "aes128-ctr"},
	} {
		if got := negotiatedCipher(t, h, tc.client...); got != tc.want {
			t.Errorf("client %v: negotiated %q, want %q", tc.client, got, tc.want)
		}
	}
}

// waitingConn holds the client's writes after its version line until the
// server's key exchange init has arrived: a client that sends its own
// init only after the server's.
type waitingConn struct {
	net.Conn
	mu      sync.Mutex
	writes  int
	read    []byte
	arrived chan struct{}
	once    sync.Once
}

func (c *waitingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.read = append(c.read, p[:n]...)
	if i := bytes.IndexByte(c.read, '\n'); i >= 0 && len(c.read) > i+1 {
		c.once.Do(func() { close(c.arrived) })
	}
	c.mu.Unlock()
	return n, err
}

func (c *waitingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes++
	first := c.writes == 1
	c.mu.Unlock()
	if !first {
		<-c.arrived
	}
	return c.Conn.Write(p)
}

// TestClientWaitingForServerKexInit: a client that waits for the server's
// key exchange init before sending its own is served once preferWait has
// passed, with the whole cipher list, rather than left until InitTimeout.
func TestClientWaitingForServerKexInit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.repo("team/app", gittest.Shape{Commits: 1})
	start := time.Now()
	client := h.dialAlice(func(nc net.Conn) net.Conn { return &waitingConn{Conn: nc, arrived: make(chan struct{})} })
	sess, stdin, stdout := h.execUploadPack(client, "/team/app")
	stdin.Write([]byte("0000"))
	stdin.Close()
	buf := make([]byte, 4)
	if _, err := stdout.Read(buf); err != nil {
		t.Fatalf("no answer: %v", err)
	}
	sess.Close()
	if took := time.Since(start); took < preferWait {
		t.Errorf("connected in %v: the server did not wait for the client's key exchange init", took)
	}
}

// TestClientCiphersParsing: what the server reads before the library
// takes over is parsed only as far as it is well formed.
func TestClientCiphersParsing(t *testing.T) {
	kexinit := func(lists ...string) []byte {
		var p []byte
		p = append(p, msgKexInit)
		p = append(p, make([]byte, 16)...)
		for _, l := range lists {
			p = append(p, byte(len(l)>>24), byte(len(l)>>16), byte(len(l)>>8), byte(len(l)))
			p = append(p, l...)
		}
		pad := 4
		length := len(p) + pad + 1
		pkt := []byte{byte(length >> 24), byte(length >> 16), byte(length >> 8), byte(length), byte(pad)}
		return append(append(pkt, p...), make([]byte, pad)...)
	}
	full := append([]byte("a banner line\r\nSSH-2.0-test\r\n"), kexinit("curve25519-sha256", "ssh-ed25519", "aes128-ctr,aes128-gcm@openssh.com", "aes128-gcm@openssh.com", "", "", "", "", "", "")...)
	c2s, s2c, state := clientCiphers(full)
	if state != parsed || strings.Join(c2s, ",") != "aes128-ctr,aes128-gcm@openssh.com" || strings.Join(s2c, ",") != "aes128-gcm@openssh.com" {
		t.Fatalf("got %v %v %v", c2s, s2c, state)
	}
	for i := range full {
		if _, _, state := clientCiphers(full[:i]); state == parsed {
			t.Fatalf("parsed from the first %d of %d bytes", i, len(full))
		}
	}
	bad := append([]byte("SSH-2.0-test\r\n"), kexinit("kex")...) // lists cut short
	if _, _, state := clientCiphers(bad); state != unparsable {
		t.Fatalf("a truncated init: %v", state)
	}
	notInit := append([]byte("SSH-2.0-test\r\n"), 0, 0, 0, 12, 4, 21, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0)
	if _, _, state := clientCiphers(notInit); state != unparsable {
		t.Fatalf("another message: %v", state)
	}
}
