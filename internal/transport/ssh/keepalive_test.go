package ssh

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/gittest"
)

// pausableConn is a client's connection that can stop being read, as
// libssh2's is whenever its application does not read: neither channel data
// nor keepalive probes are looked at until it resumes.
type pausableConn struct {
	net.Conn
	mu     sync.Mutex
	resume chan struct{} // nil when not paused
}

func (c *pausableConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	resume := c.resume
	c.mu.Unlock()
	if resume != nil {
		<-resume
	}
	return c.Conn.Read(p)
}

func (c *pausableConn) pause() {
	c.mu.Lock()
	c.resume = make(chan struct{})
	c.mu.Unlock()
}

func (c *pausableConn) unpause() {
	c.mu.Lock()
	close(c.resume)
	c.resume = nil
	c.mu.Unlock()
}

// TestKeepAliveSparesPausedClone: a client that stops servicing its
// connection mid-clone, keepalive probes included, for many keepalive
// intervals is not cut while git still has data for it; once it reads
// again the clone completes with exit status 0.
func TestKeepAliveSparesPausedClone(t *testing.T) {
	t.Parallel()
	const interval = 150 * time.Millisecond
	h := newHarness(t, func(s *Server) { s.KeepAlive = interval })
	// 24 MiB of random blobs, far more than the channel window and socket
	// buffers hold, so git still has data to send during the pause. Neither
	// deltas nor zlib can shrink random data: trying cost seconds of CPU.
	r, err := h.data.Repos.Create(context.Background(), "team/big")
	if err != nil {
		t.Fatal(err)
	}
	h.env.Git(r.Path, "config", "core.bigFileThreshold", "512k")
	h.env.Git(r.Path, "config", "core.compression", "0")
	h.env.Build(r.Path, gittest.Shape{Commits: 1, Files: 24, BlobBytes: 1 << 20, Incompress: true})

	var conn *pausableConn
	client := h.dialAlice(func(nc net.Conn) net.Conn { conn = &pausableConn{Conn: nc}; return conn })
	sess, stdin, stdout := h.execUploadPack(client, "/team/big.git")
	startUploadPack(t, stdin, stdout) // 1 MiB of the pack read

	conn.pause()
	time.Sleep(12 * interval) // the server gave up after 3 missed probes before
	conn.unpause()

	received, err := io.Copy(io.Discard, stdout)
	if err != nil {
		t.Fatalf("reading the rest of the pack after the pause: %v", err)
	}
	if err := sess.Wait(); err != nil {
		t.Fatalf("clone after the pause: %v (read %d more bytes)", err, received)
	}
	if received < 23<<20 {
		t.Fatalf("read %d bytes after the pause, want the rest of a 24 MiB pack", received)
	}
	if strings.Contains(h.logs.String(), "keepalive unanswered") {
		t.Fatalf("keepalive closed a connection with a command running:\n%s", h.logs.String())
	}
}

// TestSilentClientCannotHoldARequest: a client that stops servicing its
// connection mid-clone (it reads nothing, so it answers neither the
// channel's close nor keepalive probes) past the idle timeout: the request
// ends and git with it, though x/crypto/ssh's close of the channel does not
// wake a write waiting for the client's window or for its TCP buffer; the
// connection is closed then.
func TestSilentClientCannotHoldARequest(t *testing.T) {
	t.Parallel()
	const idle = 300 * time.Millisecond
	h := newHarness(t, func(s *Server) { s.Pipeline.Runner.IdleTimeout = idle })
	big := h.repo("team/big", gittest.Shape{Commits: 1, Files: 24, BlobBytes: 1 << 20, Incompress: true})

	var conn *pausableConn
	client := h.dialAlice(func(nc net.Conn) net.Conn { conn = &pausableConn{Conn: nc}; return conn })
	_, stdin, stdout := h.execUploadPack(client, "/team/big.git")
	startUploadPack(t, stdin, stdout)
	conn.pause()
	defer conn.unpause()
	paused := time.Now()
	if !waitFor(idle+closeGrace+5*time.Second, func() bool { return h.pipe.InFlight() == 0 && len(gitProcesses(big)) == 0 }) {
		t.Fatalf("the request still runs %v after its client went silent (idle timeout %v): %d in flight, git %v",
			time.Since(paused).Round(time.Millisecond), idle, h.pipe.InFlight(), gitProcesses(big))
	}
	t.Logf("request ended %v after the client went silent", time.Since(paused).Round(time.Millisecond))
}
