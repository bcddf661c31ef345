package ssh

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"packwire/internal/gittest"
)

// TestReadBufferedConn: byte-at-a-time reads are served from one read of
// the socket, in order, then larger reads, and the socket's EOF comes
// only after every buffered byte.
func TestReadBufferedConn(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	want := []byte("SSH-2.0-OpenSSH_9.2p1\r\n" + "kexinit that follows the version line")
	go func() {
		client.Write(want)
		client.Close()
	}()
	c := &readBufferedConn{Conn: server}
	var got []byte
	var b [1]byte
	for !bytes.HasSuffix(got, []byte("\n")) {
		if _, err := io.ReadFull(c, b[:]); err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		got = append(got, b[0])
	}
	rest, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := append(got, rest...); !bytes.Equal(got, want) {
		t.Fatalf("read %q, want %q", got, want)
	}
	if n, err := c.Read(b[:]); n != 0 || err != io.EOF {
		t.Fatalf("after the end: %d, %v; want 0, EOF", n, err)
	}
}

// readCountingConn counts reads until the client's version line (up to its
// first newline) has been read.
type readCountingConn struct {
	net.Conn
	mu       sync.Mutex
	reads    int
	lineDone bool
}

func (c *readCountingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if !c.lineDone {
		c.reads++
		c.lineDone = bytes.IndexByte(p[:n], '\n') >= 0 || err != nil
	}
	c.mu.Unlock()
	return n, err
}

type readCountingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*readCountingConn
}

func (l *readCountingListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &readCountingConn{Conn: nc}
	l.mu.Lock()
	l.conns = append(l.conns, c)
	l.mu.Unlock()
	return c, nil
}

// TestVersionLineReadAtOnce: with the real git and OpenSSH clients, the
// server reads the client's version line off the socket in one or two
// reads, not one per byte (x/crypto/ssh asks for one byte at a time).
func TestVersionLineReadAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.repo("team/app", gittest.Shape{Commits: 3})
	// A second server over the same pipeline, on a listener that counts.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counting := &readCountingListener{Listener: l}
	srv := &Server{Pipeline: h.srv.Pipeline, Access: h.srv.Access, HostKeys: h.srv.HostKeys, InitTimeout: 10 * time.Second, Log: h.srv.Log}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(counting) }()
	defer func() {
		srv.Close()
		srv.Wait()
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	out := h.mustGit("", h.aliceKey, "ls-remote", "ssh://git@127.0.0.1:"+port+"/team/app.git")
	if !bytes.Contains([]byte(out), []byte("refs/heads/main")) {
		t.Fatalf("ls-remote: %s", out)
	}
	counting.mu.Lock()
	defer counting.mu.Unlock()
	if len(counting.conns) != 1 {
		t.Fatalf("%d connections, want 1", len(counting.conns))
	}
	c := counting.conns[0]
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.lineDone || c.reads > 2 {
		t.Fatalf("version line read in %d reads (done: %v), want at most 2", c.reads, c.lineDone)
	}
}
