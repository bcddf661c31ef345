package server

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/pktline"
)

// rawHTTP opens a connection and sends a request head; the body is the
// caller's to send on conn.
func rawHTTP(t *testing.T, addr, method, path string, header ...string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	head := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", method, path, addr, strings.Join(append(header, ""), "\r\n"))
	if _, err := conn.Write([]byte(head)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// trickle writes one byte of body every interval (chunked framing when
// chunked) until stop is closed or a write fails.
func trickle(conn net.Conn, body []byte, chunked bool, interval time.Duration, stop <-chan struct{}) {
	for i := 0; ; i = (i + 1) % len(body) {
		select {
		case <-stop:
			return
		case <-time.After(interval):
		}
		b := body[i : i+1]
		if chunked {
			b = []byte(fmt.Sprintf("1\r\n%s\r\n", b))
		}
		if _, err := conn.Write(b); err != nil {
			return
		}
	}
}

// response reads one HTTP response from conn, or reports how it ended.
func response(conn net.Conn, within time.Duration) (status int, body string, err error) {
	conn.SetReadDeadline(time.Now().Add(within))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// timedClone clones url and returns how long it took; it fails the test
// if the clone fails.
func (s *testServer) timedClone(t *testing.T, env []string, url string, args ...string) time.Duration {
	t.Helper()
	start := time.Now()
	if out, err := s.env.Run(t.TempDir(), env, append(append([]string{"clone", "-q"}, args...), url, "c")...); err != nil {
		t.Fatalf("clone %s: %v\n%s", url, err, out)
	}
	return time.Since(start)
}

// TestTrickledRequestsHoldNoSlot: clients that trickle their fetch
// request (HTTP v0 bodies, chunked, a byte every 300 ms; git:// v2 fetch
// commands) hold no pack slot while they do, so clones over every
// transport go through at once, and the tricklers are refused once they
// fall behind the minimum rate. On the old server two such bodies held
// both slots of the repository and every clone failed "server busy".
func TestTrickledRequestsHoldNoSlot(t *testing.T) {
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, func(c *Config) {
		enableSSH(c)
		c.MaxPackJobs, c.MaxPackJobsPerRepo, c.MaxQueueWait = 2, 2, 3*time.Second
		c.InitTimeout, c.RequestMinRate, c.RequestTimeout = 3*time.Second, 1024, 0
	})
	sshEnv := sshEnvFor(s)
	head := s.env.RevParse(s.seed(t, "team/app"), "HEAD")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()

	body := pkts("want "+head+" multi_ack_detailed side-band-64k", "", "done")
	var httpConns []net.Conn
	for i := 0; i < 2; i++ {
		conn := rawHTTP(t, s.HTTPAddr.String(), "POST", "/team/app/git-upload-pack",
			"Content-Type: application/x-git-upload-pack-request", "Transfer-Encoding: chunked")
		httpConns = append(httpConns, conn)
		wg.Add(1)
		go func() { defer wg.Done(); trickle(conn, body, true, 300*time.Millisecond, stop) }()
	}
	var gitConns []net.Conn
	for i := 0; i < 2; i++ {
		conn, err := net.Dial("tcp", s.GitAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.Write(request("git-upload-pack", "/team/app", "\x00version=2\x00"))
		r := pktline.NewReader(conn)
		for { // the capability advertisement
			if kind, _, err := r.Read(); err != nil || kind == pktline.Flush {
				break
			}
		}
		conn.Write(pkts("command=fetch", "agent=trickler"))
		gitConns = append(gitConns, conn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			trickle(conn, pkts("DELIM", "want "+head, "done", ""), false, 300*time.Millisecond, stop)
		}()
	}
	time.Sleep(time.Second)
	if running, _ := s.Pipeline.Limiter.Stats(); running != 0 {
		t.Fatalf("tricklers hold %d pack slots", running)
	}
	for _, c := range []struct {
		url string
		env []string
	}{{s.gitURL("team/app"), nil}, {s.sshURL("team/app"), sshEnv}, {s.httpURL("team/app"), nil}} {
		d := s.timedClone(t, c.env, c.url, "-c", "protocol.version=0")
		t.Logf("clone %s while 4 clients trickle: %v", c.url, d)
		if d > 2*time.Second {
			t.Errorf("clone %s took %v", c.url, d)
		}
	}
	// Past the grace period, each trickler has fallen behind and is refused.
	for _, conn := range httpConns {
		status, text, err := response(conn, 15*time.Second)
		if err != nil || status != http.StatusRequestTimeout || !strings.Contains(text, "request too slow") {
			t.Errorf("HTTP trickler: status %d %q, err %v", status, text, err)
		}
	}
	for _, conn := range gitConns {
		conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		got, _ := io.ReadAll(conn)
		if !strings.Contains(string(got), "ERR request too slow") {
			t.Errorf("git:// trickler got %q", got)
		}
	}
}

// TestTrickledLsRefsSpawnNothing: trickled HTTP ls-refs bodies spawn no git
// while they trickle, one client's requests beyond --max-requests-per-client
// are refused at once, and another user's clone goes through.
func TestTrickledLsRefsSpawnNothing(t *testing.T) {
	s := startServer(t, func(c *Config) {
		c.MaxRequestsPerClient = 8
		c.InitTimeout, c.RequestMinRate = 30*time.Second, 1024
	})
	s.seed(t, "team/app")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	body := pkts("command=ls-refs", "agent=x", "DELIM", "peel", "")
	var refused int
	for i := 0; i < 20; i++ {
		if i == 8 {
			waitActive(t, s, 8) // the first 8 run before the ninth comes
		}
		conn := rawHTTP(t, s.HTTPAddr.String(), "POST", "/team/app/git-upload-pack", "Git-Protocol: version=2",
			"Content-Type: application/x-git-upload-pack-request", "Transfer-Encoding: chunked")
		conn.Write([]byte("4\r\n0014\r\n")) // the first bytes of the body
		if i >= 8 {
			status, text, err := response(conn, 10*time.Second)
			if err != nil || status != http.StatusServiceUnavailable || !strings.Contains(text, "too many concurrent requests from anonymous@127.0.0.1 (max 8)") {
				t.Fatalf("request %d beyond the cap: %d %q %v\n%s", i, status, text, err, s.logs.String())
			}
			refused++
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); trickle(conn, body[4:], true, 500*time.Millisecond, stop) }()
	}
	time.Sleep(500 * time.Millisecond)
	if kids := s.gitChildren("upload-pack"); len(kids) != 0 {
		t.Fatalf("trickled ls-refs spawned git: %v", kids)
	}
	// From the same address, but as alice (credentials up front, as a CI
	// job's http.extraHeader sends them).
	d := s.timedClone(t, nil, s.httpURL("team/app"), "-c", "http.extraHeader=Authorization: Basic "+basicAuth("alice", s.token))
	t.Logf("alice's clone while anonymous trickles 8 requests: %v", d)
	// Queued behind the tricklers, the clone would wait for their
	// InitTimeout (30 s); a clone on its own takes well under a second
	// on an idle machine, and a few seconds at a load of 50.
	if d > 15*time.Second {
		t.Errorf("clone took %v: queued behind the trickled requests?", d)
	}
}

// TestEndlessBodies: requests whose body never ends (a Content-Length
// larger than what is sent, an endless chunked body) are answered or
// closed once their bound or the idle timeout ends them, fetches and
// pushes alike; the server keeps no connection and no git for them.
func TestEndlessBodies(t *testing.T) {
	s := startServer(t, func(c *Config) {
		c.IdleTimeout, c.InitTimeout, c.RequestTimeout = time.Second, time.Second, 3*time.Second
	})
	head := s.env.RevParse(s.seed(t, "team/app"), "HEAD")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	auth := "Authorization: Basic " + basicAuth("alice", s.token)
	var conns []net.Conn
	for i := 0; i < 5; i++ {
		// Fetch, Content-Length larger than what is sent.
		c := rawHTTP(t, s.HTTPAddr.String(), "POST", "/team/app/git-upload-pack",
			"Content-Type: application/x-git-upload-pack-request", "Content-Length: 1000000")
		c.Write(pkts("want " + head))
		conns = append(conns, c)
		// Push, Content-Length larger than what is sent.
		c = rawHTTP(t, s.HTTPAddr.String(), "POST", "/team/app/git-receive-pack", auth,
			"Content-Type: application/x-git-receive-pack-request", "Content-Length: 1000000")
		c.Write(pushCommands("report-status", head+" "+head+" refs/heads/main"))
		conns = append(conns, c)
		// Fetch, an endless chunked body sent fast (haves forever).
		endless := rawHTTP(t, s.HTTPAddr.String(), "POST", "/team/app/git-upload-pack",
			"Content-Type: application/x-git-upload-pack-request", "Transfer-Encoding: chunked")
		conns = append(conns, endless)
		wg.Add(1)
		go func() {
			defer wg.Done()
			chunk := pkts("want "+head, "")
			for j := 0; j < 100; j++ {
				chunk = append(chunk, pkts("have "+head)...)
			}
			frame := []byte(fmt.Sprintf("%x\r\n%s\r\n", len(chunk), chunk))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := endless.Write(frame); err != nil {
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
		// Push, an endless chunked body trickled after the commands.
		trickled := rawHTTP(t, s.HTTPAddr.String(), "POST", "/team/app/git-receive-pack", auth,
			"Content-Type: application/x-git-receive-pack-request", "Transfer-Encoding: chunked")
		cmds := pushCommands("report-status", head+" "+head+" refs/heads/main")
		trickled.Write([]byte(fmt.Sprintf("%x\r\n%s\r\n", len(cmds), cmds)))
		conns = append(conns, trickled)
		wg.Add(1)
		go func() { defer wg.Done(); trickle(trickled, []byte("PACK"), true, 1500*time.Millisecond, stop) }()
	}
	deadline := time.Now().Add(20 * time.Second)
	for i, c := range conns {
		// Whatever the answer, the server must end the exchange: a response
		// followed by the connection closing, or the connection closing.
		c.SetReadDeadline(deadline)
		_, err := io.ReadAll(c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("connection %d still open 20s later", i)
		}
	}
	s.waitNoChildren(t, "team/app", 5*time.Second)
}

// waitActive waits until n requests are running (reading their bodies).
func waitActive(t *testing.T, s *testServer, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Pipeline.Active()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests running, want %d", len(s.Pipeline.Active()), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func basicAuth(user, pass string) string {
	return base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
}

// pkts frames lines as pkt-lines ("" is a flush, "DELIM" a delim-pkt).
func pkts(lines ...string) []byte {
	var b []byte
	for _, l := range lines {
		switch l {
		case "":
			b = append(b, "0000"...)
		case "DELIM":
			b = append(b, "0001"...)
		default:
			b, _ = pktline.Append(b, []byte(l+"\n"))
		}
	}
	return b
}

// TestSpooledBodiesBounded: fetch bodies over 1 MiB kept arriving (here
// sent fast, then left open) hold disk in DATA/tmp only up to the bound
// per address and the bound in all; past them a body is refused with 503
// and Retry-After. On the old server every such body was kept on disk
// (ten 20 MiB bodies held 191 MiB).
func TestSpooledBodiesBounded(t *testing.T) {
	const mib = 1 << 20
	s := startServer(t, func(c *Config) {
		c.MaxSpooledBytes, c.MaxSpooledBytesPerAddr = 5*mib, 4*mib
		c.InitTimeout, c.RequestMinRate = 30*time.Second, 1024
	})
	s.seed(t, "team/app")
	tmp := s.Pipeline.TempDir
	spooled := func() int64 {
		var n int64
		entries, _ := os.ReadDir(tmp)
		for _, e := range entries {
			if info, err := e.Info(); err == nil {
				n += info.Size()
			}
		}
		return n
	}
	body := bytes.Repeat([]byte("0032have 0123456789012345678901234567890123456789\n"), 3*mib/2/50)
	// open sends a body of 1.5 MiB from the address from, as one chunk of
	// a chunked body that never ends.
	open := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		conn, err := d.Dial("tcp", s.HTTPAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		head := fmt.Sprintf("POST /team/app/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-git-upload-pack-request\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n", len(body))
		go func() { conn.Write(append([]byte(head), body...)) }() // the server may stop reading it
		return conn
	}
	waitSpooled := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for spooled() < want {
			if time.Now().After(deadline) {
				t.Fatalf("%d bytes spooled, want %d", spooled(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	refused := func(conn net.Conn, want string) {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer past the bound (%d bytes spooled): %v", spooled(), err)
		}
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(text), want) {
			t.Fatalf("past the bound: %s (Retry-After %q) %q", resp.Status, resp.Header.Get("Retry-After"), text)
		}
	}
	size := int64(len(body))
	open("127.0.0.1")
	waitSpooled(size)
	open("127.0.0.1")
	waitSpooled(2 * size)
	refused(open("127.0.0.1"), "server busy: request bodies on disk from 127.0.0.1 at their bound (4.0 MiB)")
	open("127.0.0.2")
	waitSpooled(3 * size)
	refused(open("127.0.0.2"), "server busy: request bodies on disk at their bound (5.0 MiB)")
	if n := spooled(); n > 5*mib {
		t.Fatalf("%d bytes spooled past the 5 MiB bound", n)
	}
}
