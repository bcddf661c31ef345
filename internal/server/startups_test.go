package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// attacker dials from 127.0.0.2, another address of Linux's loopback.
var attacker = &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}

// holdFrom opens n idle connections to addr from 127.0.0.2, closed at the
// end of the test.
func holdFrom(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var held []net.Conn
	for range n {
		c, err := attacker.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		held = append(held, c)
	}
	return held
}

// untilRefused repeats probe from 127.0.0.2 until it reports a refusal (the
// server has counted the held connections by then), for a bounded time.
func untilRefused(t *testing.T, what string, probe func() (refused bool, got string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		refused, got := probe()
		if refused {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: a connection from 127.0.0.2 over the per-address bound was not refused; last answer:\n%s", what, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStartupsPerAddress: idle connections from one address (127.0.0.2),
// as many as --max-connections, no longer fill the git://, HTTP and SSH
// listeners: past the per-address bound on connections that have not sent
// a request yet they are refused (git://: ERR; HTTP: 503 with the reason;
// SSH: closed before the banner), logged with the reason, and a client from
// 127.0.0.1 still clones over all three at once. On the old code the idle
// connections took every slot and the clones were refused as "server busy".
// HTTP connections that have sent a request no longer count.
func TestStartupsPerAddress(t *testing.T) {
	const perAddress, maxConns = 3, 12
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, func(c *Config) {
		enableSSH(c)
		c.MaxConnections, c.MaxStartupsPerAddress = maxConns, perAddress
		c.PenaltyMax = 0 // the refusals, not the penalty they earn: TestPenaltyRefusesAtAccept
	})
	s.seed(t, "team/app")
	sshEnv := sshEnvFor(s)
	wantMsg := fmt.Sprintf("server busy: too many connections from your address that have not sent a request yet (max %d)", perAddress)

	// HTTP first: connections that have sent a request (kept alive) do not
	// count, so as many as the bound of them leave room for a fresh one.
	for range perAddress {
		c, err := attacker.Dial("tcp", s.HTTPAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if status, got := getOn(c, s.HTTPAddr.String()); !answered(status) {
			t.Fatalf("a keep-alive request from 127.0.0.2: %d %s", status, got)
		}
	}
	if status, got := probeHTTPFrom(s.HTTPAddr.String()); !answered(status) {
		t.Fatalf("connections past their request still count: a new one got %d %s", status, got)
	}

	holdFrom(t, s.GitAddr.String(), maxConns)
	holdFrom(t, s.HTTPAddr.String(), maxConns)
	holdFrom(t, s.SSHAddr.String(), maxConns)

	untilRefused(t, "git://", func() (bool, string) {
		c, err := attacker.Dial("tcp", s.GitAddr.String())
		if err != nil {
			return false, err.Error()
		}
		defer c.Close()
		c.Write(mustPkt("git-upload-pack /team/app\x00host=x\x00"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		return strings.Contains(string(b), "ERR "+wantMsg), string(b)
	})
	untilRefused(t, "HTTP", func() (bool, string) {
		status, body := probeHTTPFrom(s.HTTPAddr.String())
		return status == http.StatusServiceUnavailable && strings.Contains(body, wantMsg), fmt.Sprint(status, " ", body)
	})
	untilRefused(t, "SSH", func() (bool, string) {
		c, err := attacker.Dial("tcp", s.SSHAddr.String())
		if err != nil {
			return false, err.Error()
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(io.LimitReader(c, 7))
		return len(b) == 0, string(b) // closed before the banner
	})
	for _, transport := range []string{"git", "http", "ssh"} {
		if !strings.Contains(s.logs.String(), "transport="+transport) ||
			!strings.Contains(s.logs.String(), "too many connections from this address that have not sent a request yet (max 3)") {
			t.Fatalf("refusal over %s not logged with its reason:\n%s", transport, lastLines(s.logs.String(), 20))
		}
	}

	for _, url := range []string{s.gitURL("team/app"), s.httpURL("team/app"), s.sshURL("team/app")} {
		out, err := s.env.Run("", sshEnv, "clone", "-q", url, filepath.Join(t.TempDir(), "c"))
		if err != nil {
			t.Fatalf("clone %s from 127.0.0.1 while 127.0.0.2 holds idle connections: %v\n%s", url, err, out)
		}
	}
}

// answered: the login page answered (401 without a session), not a refusal.
func answered(status int) bool { return status != 0 && status != http.StatusServiceUnavailable }

// getOn sends a keep-alive GET of the dashboard's login page on c and
// returns the status and body.
func getOn(c net.Conn, host string) (int, string) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	fmt.Fprintf(c, "GET /-/ HTTP/1.1\r\nHost: %s\r\n\r\n", host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// probeHTTPFrom is a GET of the login page on a new connection from 127.0.0.2.
func probeHTTPFrom(addr string) (int, string) {
	c, err := attacker.Dial("tcp", addr)
	if err != nil {
		return 0, err.Error()
	}
	defer c.Close()
	return getOn(c, addr)
}
