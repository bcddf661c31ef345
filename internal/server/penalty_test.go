package server

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// probeFrom sends send from 127.0.0.2 to the git:// listener and returns
// what the server answered up to a flush or its close ("" for a
// connection refused at accept: held, then reset, or reset before the
// dial ends).
func probeFrom(t *testing.T, addr string, send []byte) string {
	t.Helper()
	c, err := attacker.Dial("tcp", addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(send)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.HasSuffix(got, []byte("0000")) { // an advertisement ends with a flush
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	return string(got)
}

// TestPenaltyRefusesAtAccept: an address (127.0.0.2) that sends malformed
// request lines is, once its penalty passes --penalty-min, closed right
// after accept on every listener (git://, HTTP, SSH), with nothing read or
// written; another
// address (127.0.0.1) still clones; the refusals are logged once, not per
// connection; and once the penalty has run out the address is served
// again. On the old code every malformed line was read and answered.
func TestPenaltyRefusesAtAccept(t *testing.T) {
	// Five malformed lines (2 s each) pass a 9 s minimum: a 10 s block,
	// long enough for the probes below, each held 1 s before its reset.
	const block = 10 * time.Second
	s := startServer(t, func(c *Config) {
		c.SSHAddr = "127.0.0.1:0"
		c.PenaltyMin, c.PenaltyMax = 9*time.Second, block
	})
	s.seed(t, "team/app")
	git := s.GitAddr.String()
	valid := request("git-upload-pack", "/team/app", "")

	if got := probeFrom(t, git, valid); !strings.Contains(got, "refs/heads/main") {
		t.Fatalf("before any offence: %q, want the advertisement", got)
	}
	var lastOffence time.Time
	for i := 0; ; i++ {
		lastOffence = time.Now()
		got := probeFrom(t, git, []byte("zzzz"))
		if got == "" {
			break // closed at accept
		}
		if !strings.Contains(got, "ERR malformed request") {
			t.Fatalf("malformed line %d answered %q", i, got)
		}
		if i == 8 {
			t.Fatal("nine malformed request lines and the address is still served")
		}
	}
	for range 2 {
		if got := probeFrom(t, git, valid); got != "" {
			t.Fatalf("a penalized address was answered: %q", got)
		}
	}
	// The same address is refused over HTTP too, before net/http reads.
	c := &http.Client{Transport: &http.Transport{DialContext: attacker.DialContext}, Timeout: 10 * time.Second}
	if resp, err := c.Get("http://" + s.HTTPAddr.String() + "/team/app/info/refs?service=git-upload-pack"); err == nil {
		resp.Body.Close()
		t.Fatalf("a penalized address got HTTP %d", resp.StatusCode)
	}
	// And over SSH, before the server's banner.
	if got := probeFrom(t, s.SSHAddr.String(), []byte("SSH-2.0-probe\r\n")); got != "" {
		t.Fatalf("a penalized address got an SSH banner: %q", got)
	}
	// Another address is not affected.
	if out, err := s.env.Run("", nil, "ls-remote", s.gitURL("team/app")); err != nil || !strings.Contains(out, "refs/heads/main") {
		t.Fatalf("ls-remote from 127.0.0.1 during 127.0.0.2's penalty: %v\n%s", err, out)
	}
	logs := s.logs.String()
	if n := strings.Count(logs, "refusing an address's connections at accept"); n != 1 || !strings.Contains(logs, "remote=127.0.0.2") {
		t.Fatalf("the penalty was logged %d times, want once for 127.0.0.2:\n%s", n, logs)
	}
	if n := strings.Count(logs, `msg="connection refused"`); n > 1 {
		t.Fatalf("%d lines for refused connections, want one line per reason:\n%s", n, logs)
	}

	// The penalty runs out: the address is served again, not before the
	// block has passed since its last offence.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if got := probeFrom(t, git, valid); got != "" {
			if !strings.Contains(got, "refs/heads/main") {
				t.Fatalf("after the penalty: %q", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still refused 30 s after a 10 s penalty")
		}
		time.Sleep(50 * time.Millisecond) // polling the expiry, not synchronizing
	}
	if since := time.Since(lastOffence); since < block {
		t.Fatalf("served again %s after the last offence, before the %s block ran out", since, block)
	}
}
