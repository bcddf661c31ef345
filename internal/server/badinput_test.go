package server

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"packwire/internal/governor"
	"packwire/internal/pktline"
	"packwire/internal/procgroup"
)

// rawGit sends raw bytes to the git:// listener and returns what came back
// before the server closed the connection.
func rawGit(t *testing.T, addr string, send []byte) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(send)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}

func mustPkt(payload string) []byte {
	b, err := pktline.Append(nil, []byte(payload))
	if err != nil {
		panic(err)
	}
	return b
}

func request(service, path, extra string) []byte {
	b, _ := pktline.Append(nil, []byte(service+" "+path+"\x00host=localhost\x00"+extra))
	return b
}

func TestGitProtocolBadInput(t *testing.T) {
	s := startServer(t, func(c *Config) {
		c.InitTimeout = 300 * time.Millisecond
		c.PenaltyMax = 0 // one address sends every bad input: TestPenaltyRefusesAtAccept
	})
	s.seed(t, "team/app")
	outside := filepath.Join(t.TempDir(), "secret.git")
	s.env.Git("", "init", "--bare", "-q", outside)
	os.Symlink(outside, filepath.Join(s.Data.Repos.Dir, "escape.git"))
	os.MkdirAll(filepath.Join(s.Data.Repos.Dir, "worktree"), 0o755)
	s.env.Git(filepath.Join(s.Data.Repos.Dir, "worktree"), "init", "-q")
	addr := s.GitAddr.String()

	cases := []struct {
		name string
		send []byte
		want string
	}{
		{"dotdot", request("git-upload-pack", "/../secret.git", ""), "ERR repository '../secret.git' not found"},
		{"encoded dotdot", request("git-upload-pack", "/%2e%2e/secret.git", ""), "not found"},
		{"absolute", request("git-upload-pack", outside, ""), "not found"},
		{"symlink outside", request("git-upload-pack", "/escape.git", ""), "not found"},
		{"non-bare", request("git-upload-pack", "/worktree", ""), "not found"},
		{"non-bare .git", request("git-upload-pack", "/worktree/.git", ""), "not found"},
		{"unknown", request("git-upload-pack", "/nope.git", ""), "ERR repository 'nope.git' not found"},
		{"unknown service", request("git-frobnicate", "/team/app", ""), "service not supported"},
		{"receive-pack", request("git-receive-pack", "/team/app", ""), "push over git:// is not supported"},
		{"bad length", []byte("zzzzgit-upload-pack"), "ERR malformed request: pkt-line: invalid length prefix"},
		{"flush first", []byte("0000"), "ERR malformed request"},
		{"no NUL", mustPkt("git-upload-pack /x\n"), "ERR malformed request: no NUL"},
		{"truncated", []byte("0040git-upload-pack /team/a"), "connection closed before the request line ended"},
		{"never ends", []byte("0040git-upload-pack /team/app"), ""}, // connection kept open: see below
		{"control chars in protocol", request("git-upload-pack", "/team/app", "\x00version=2\n\x01"), "version 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "never ends" {
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				conn.Write(c.send)
				conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				start := time.Now()
				b, _ := io.ReadAll(conn)
				if !strings.Contains(string(b), "timed out waiting for the request line") || time.Since(start) > 3*time.Second {
					t.Fatalf("got %q after %v", b, time.Since(start))
				}
				return
			}
			send := c.send
			if c.name == "truncated" {
				conn, _ := net.Dial("tcp", addr)
				conn.Write(send)
				conn.(*net.TCPConn).CloseWrite()
				conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				b, _ := io.ReadAll(conn)
				conn.Close()
				if !strings.Contains(string(b), c.want) {
					t.Fatalf("got %q, want %q", b, c.want)
				}
				return
			}
			got := rawGit(t, addr, send)
			if c.name == "control chars in protocol" {
				// The bad GIT_PROTOCOL is dropped: the server answers in v0.
				if strings.Contains(got, "version 2") || !strings.Contains(got, "refs/heads/main") {
					t.Fatalf("got %q", got)
				}
				return
			}
			if !strings.Contains(got, c.want) {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
	// The server still serves after all that.
	if out := s.env.Git("", "ls-remote", s.gitURL("team/app")); !strings.Contains(out, "refs/heads/main") {
		t.Fatalf("server stopped serving: %s", out)
	}
}

func TestHTTPBadInput(t *testing.T) {
	s := startServer(t, func(c *Config) { c.MaxRequestBody = 1 << 20 })
	s.seed(t, "team/app")
	outside := filepath.Join(t.TempDir(), "secret.git")
	s.env.Git("", "init", "--bare", "-q", outside)
	os.Symlink(outside, filepath.Join(s.Data.Repos.Dir, "escape.git"))
	base := "http://" + s.HTTPAddr.String()

	rawGet := func(path string) string {
		// net/http would clean the path; send it as written.
		c, err := net.Dial("tcp", s.HTTPAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.Status + " " + string(b)
	}
	for _, p := range []string{
		"/../secret.git/info/refs?service=git-upload-pack",
		"/%2e%2e/secret.git/info/refs?service=git-upload-pack",
		"/team/%2e%2e/%2e%2e/secret.git/info/refs?service=git-upload-pack",
		"//" + strings.TrimPrefix(outside, "/") + "/info/refs?service=git-upload-pack",
		"/escape.git/info/refs?service=git-upload-pack",
		"/team/app.git%00/info/refs?service=git-upload-pack",
	} {
		if got := rawGet(p); !strings.HasPrefix(got, "404") {
			t.Errorf("GET %s: %s", p, got)
		}
	}

	post := func(body []byte, hdr map[string]string) (int, string) {
		req, _ := http.NewRequest("POST", base+"/team/app/git-upload-pack", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/x-git-upload-pack-request")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// A valid gzip-encoded request (git's client compresses large ones) is
	// decoded and answered with a pack.
	var small bytes.Buffer
	zw0 := gzip.NewWriter(&small)
	zw0.Write([]byte(string(mustPkt("want "+s.env.RevParse(filepath.Join(s.Data.Repos.Dir, "team/app.git"), "main")+"\n")) + "0000" + string(mustPkt("done\n"))))
	zw0.Close()
	if code, body := post(small.Bytes(), map[string]string{"Content-Encoding": "gzip"}); code != 200 || !strings.Contains(body, "PACK") {
		t.Errorf("a gzip-encoded request: %d, %d bytes, want 200 and a pack", code, len(body))
	}

	// A gzip bomb: 1 GiB of valid want lines, which git would keep reading,
	// in about 3 MiB: 1024 gzip members of the same 1 MiB, which a gzip
	// reader decodes one after the other (compressing the whole GiB at
	// once took seconds of CPU for the same size).
	var member, bomb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
	line := mustPkt("want " + s.env.RevParse(filepath.Join(s.Data.Repos.Dir, "team/app.git"), "main") + "\n")
	zw.Write(bytes.Repeat(line, (1<<20)/len(line)))
	zw.Close()
	for i := 0; i < 1024; i++ {
		bomb.Write(member.Bytes())
	}
	start := time.Now()
	if code, body := post(bomb.Bytes(), map[string]string{"Content-Encoding": "gzip"}); code != 413 || !strings.Contains(body, "too large") {
		t.Errorf("gzip bomb: %d %q", code, body)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("gzip bomb took %v", d)
	}
	if code, body := post([]byte("not gzip"), map[string]string{"Content-Encoding": "gzip"}); code != 400 {
		t.Errorf("bad gzip: %d %q", code, body)
	}
	if code, _ := post([]byte("0000"), map[string]string{"Content-Encoding": "br"}); code != 415 {
		t.Errorf("unknown encoding: %d", code)
	}
	if code, _ := post([]byte("0000"), map[string]string{"Content-Type": "text/plain"}); code != 415 {
		t.Errorf("wrong content type: %d", code)
	}
	// Malformed pkt-lines reach git, which rejects them before any pack
	// went out: a 400 with the reason, or git's own ERR line in a 200
	// (a well-formed request for an object the repository lacks).
	for body, want := range map[string]struct {
		code int
		text string
	}{
		"zzzz":     {400, "git could not process the request"},
		"fff0want": {400, "git could not process the request"},
		"0009want": {400, "git could not process the request"},
		"0032want 0000000000000000000000000000000000000000\n": {200, "ERR upload-pack: not our ref"},
	} {
		if code, resp := post([]byte(body), nil); code != want.code || !strings.Contains(resp, want.text) {
			t.Errorf("malformed request %q: %d %q, want %d and %q", body, code, resp, want.code, want.text)
		}
	}
	if out := s.env.Git("", "ls-remote", s.httpURL("team/app")); !strings.Contains(out, "refs/heads/main") {
		t.Fatalf("server stopped serving: %s", out)
	}
}

// childProc is a child process of this test binary.
type childProc struct {
	pid     int
	cmdline string // arguments joined by spaces
}

// children lists this test binary's child processes whose command line
// contains match and s's data directory: the server's own gits
// (upload-pack/receive-pack name the repository they serve), not those of
// the servers of the tests running beside it in parallel, each with a
// data directory of its own.
func (s *testServer) children(match string) []childProc {
	return children(filepath.Clean(s.Config.DataDir)+string(filepath.Separator), match)
}

// children lists this test binary's child processes whose command line
// contains both within and match.
func children(within, match string) []childProc {
	entries, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	var found []childProc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 || fields[1] != self {
			continue
		}
		raw, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		cmdline := strings.ReplaceAll(string(raw), "\x00", " ")
		if strings.Contains(cmdline, match) && strings.Contains(cmdline, within) {
			found = append(found, childProc{pid, cmdline})
		}
	}
	return found
}

// gitChildren lists the command lines of s.children(match).
func (s *testServer) gitChildren(match string) []string {
	var lines []string
	for _, c := range s.children(match) {
		lines = append(lines, c.cmdline)
	}
	return lines
}

// waitNoChildren waits until none of s.children(match) is left, and fails
// the test if some still run after within.
func (s *testServer) waitNoChildren(t *testing.T, match string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := s.gitChildren(match)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("git children still running %v after the client left: %v", within, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClientVanishesMidClone kills a cloning client once pack data flows
// and checks that the server's git is killed and reaped within a second,
// on both transports, and that the server keeps serving.
func TestClientVanishesMidClone(t *testing.T) {
	t.Parallel() // it counts its own server's gits only (s.children)
	// The relay's own behaviour; the fetch cache's is TestFetchCacheClientsLeave.
	s := startServer(t, func(c *Config) { c.FetchCache = false })
	s.bigRepo(t, "big")

	for _, url := range []string{s.gitURL("big"), s.httpURL("big")} {
		t.Run(url[:4], func(t *testing.T) {
			seq := s.lastSeq(t)
			dir := filepath.Join(t.TempDir(), "c")
			cmd := exec.Command("git", "clone", "--progress", url, dir)
			cmd.Env = append(s.env.Vars, "GIT_TRACE_PACKET=0")
			stderr, _ := cmd.StderrPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waitProgress(stderr, "Receiving objects:")
			if len(s.gitChildren("upload-pack")) == 0 {
				t.Fatal("no upload-pack running mid-clone: the repository is too small to test this")
			}
			cmd.Process.Kill()
			cmd.Wait()
			s.waitNoChildren(t, "upload-pack", time.Second)
			// The governor still has a record of it, with the reason.
			recs := s.recordsAfter(t, seq, func(r []governor.Record) bool { _, ok := findKind(r, "full-clone"); return ok })
			rec, _ := findKind(recs, "full-clone")
			if rec.Result != governor.ResultClientGone || rec.Error == "" || rec.BytesOut == 0 {
				t.Fatalf("record of the abandoned clone: %+v", rec)
			}
		})
	}
	if out := s.env.Git("", "ls-remote", s.gitURL("big")); !strings.Contains(out, "refs/heads/main") {
		t.Fatalf("server stopped serving: %s", out)
	}
}

// waitProgress reads git's progress output until the phase has moved past
// 0% (the pack is flowing), then drains the rest in the background so git
// never blocks on a full stderr pipe.
func waitProgress(stderr io.Reader, phase string) {
	sc := bufio.NewScanner(stderr)
	sc.Split(scanCRLF)
	for sc.Scan() {
		if strings.Contains(sc.Text(), phase) && !strings.Contains(sc.Text(), " 0% ") {
			break
		}
	}
	go io.Copy(io.Discard, stderr)
}

func scanCRLF(data []byte, atEOF bool) (int, []byte, error) {
	for i, b := range data {
		if b == '\r' || b == '\n' {
			return i + 1, data[:i], nil
		}
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// TestClientVanishesMidPush kills a pushing client mid-pack: the server's
// receive-pack is reaped, the refs are untouched and the repo is intact.
func TestClientVanishesMidPush(t *testing.T) {
	t.Parallel() // it counts its own server's gits only (s.children)
	s := startServer(t, nil)
	bare := s.seed(t, "team/app")
	before := s.env.Git(bare, "show-ref")
	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", s.httpURL("team/app"), w)
	// 40 MiB of incompressible data to push, history unrelated to main's:
	// the shared big template's objects, borrowed (alternates), not built.
	big := bigTemplatePath(t, s.env)
	if err := os.WriteFile(filepath.Join(w, ".git", "objects", "info", "alternates"), []byte(filepath.Join(big, "objects")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.env.Git(w, "update-ref", "refs/heads/big", s.env.RevParse(big, "main"))
	cmd := exec.Command("git", "push", "--progress", s.pushURL("team/app"), "big:refs/heads/big")
	cmd.Dir = w
	cmd.Env = s.env.Vars
	// The whole client goes: git push's remote-http, send-pack and
	// pack-objects outlive a kill of git push alone and carry on pushing.
	stderr, _ := cmd.StderrPipe()
	procgroup.Start(cmd)
	waitProgress(stderr, "Writing objects:")
	// git reports progress as it packs; its HTTP request may start later
	// (remote-http buffers the first MiB): kill once the server has it.
	for deadline := time.Now().Add(time.Minute); len(s.gitChildren("receive-pack")) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server never started receive-pack for the push")
		}
	}
	procgroup.Kill(cmd)
	cmd.Wait()
	s.waitNoChildren(t, "receive-pack", 3*time.Second)
	if after := s.env.Git(bare, "show-ref"); after != before {
		t.Fatalf("refs changed by an interrupted push:\n%s", after)
	}
	// receive-pack was asked to stop (SIGTERM), so it removed its
	// quarantine itself; a SIGKILL left it on disk until maintenance.
	if left, _ := filepath.Glob(filepath.Join(bare, "objects", "tmp_objdir-*")); len(left) != 0 {
		t.Fatalf("the interrupted push left its quarantine: %v", left)
	}
	s.env.Fsck(bare)
}

// TestNoLeaks runs a batch of requests, good and bad, shuts the server
// down, and checks goroutines, file descriptors and processes come back.
func TestNoLeaks(t *testing.T) {
	fdsBefore := countFDs()
	goroutinesBefore := runtime.NumGoroutine()
	s := startServer(t, nil)
	settle(t, s.seed(t, "team/app"))
	for i := 0; i < 2; i++ { // through the fetch cache: a run, then a replay
		if out, err := s.env.Run("", v2, "clone", "-q", "--bare", s.httpURL("team/app"), filepath.Join(t.TempDir(), "c")); err != nil {
			t.Fatal(err, out)
		}
	}
	for i := 0; i < 5; i++ {
		s.env.Git("", "ls-remote", s.gitURL("team/app"))
		s.env.Git("", "ls-remote", s.httpURL("team/app"))
		rawGit(t, s.GitAddr.String(), []byte("zzzz"))
		s.env.Run("", nil, "ls-remote", s.gitURL("nope"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	http.DefaultClient.CloseIdleConnections()
	deadline := time.Now().Add(3 * time.Second)
	for {
		g, fds := runtime.NumGoroutine(), countFDs()
		if g <= goroutinesBefore+2 && fds <= fdsBefore+2 {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			n := runtime.Stack(buf, true)
			t.Fatalf("leak: goroutines %d -> %d, fds %d -> %d\n%s", goroutinesBefore, g, fdsBefore, fds, buf[:n])
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Every child, not only those naming the data directory: this test
	// runs alone (it counts the whole process's goroutines and descriptors).
	if left := children("", "git"); len(left) > 0 {
		t.Fatalf("processes left: %v", left)
	}
}

func countFDs() int {
	entries, _ := os.ReadDir("/proc/self/fd")
	return len(entries)
}

// TestShutdownWithStuckReader: a client asks for a large pack and never
// reads it, so the relay's write blocks. Shutdown must still end within
// its grace period (plus a little), killing git and unblocking the write.
func TestShutdownWithStuckReader(t *testing.T) {
	s := startServer(t, nil)
	head := s.env.RevParse(s.bigRepo(t, "big"), "main")

	var conns []net.Conn
	for _, transport := range []string{"git", "http"} {
		conn, err := net.Dial("tcp", map[string]string{"git": s.GitAddr.String(), "http": s.HTTPAddr.String()}[transport])
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns = append(conns, conn)
		wants := string(mustPkt("want "+head+" ofs-delta\n")) + "0000" + string(mustPkt("done\n"))
		if transport == "git" {
			conn.Write(request("git-upload-pack", "/big", ""))
			// Read the advertisement up to its flush, then ask and stop reading.
			pr := pktline.NewReader(conn)
			for {
				kind, _, err := pr.Read()
				if err != nil {
					t.Fatal(err)
				}
				if kind == pktline.Flush {
					break
				}
			}
			conn.Write([]byte(wants))
		} else {
			fmt.Fprintf(conn, "POST /big/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-git-upload-pack-request\r\nContent-Length: %d\r\n\r\n%s", len(wants), wants)
		}
	}
	// Let both relays fill the socket buffers and block.
	deadline := time.Now().Add(5 * time.Second)
	for len(s.gitChildren("upload-pack")) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() { s.Shutdown(ctx); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		for _, c := range conns {
			c.Close()
		}
		<-done
		t.Fatal("shutdown still blocked 3s into a 500ms grace period by clients that stopped reading")
	}
	s.waitNoChildren(t, "upload-pack", time.Second)
}
