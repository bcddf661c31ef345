package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"packwire/bench/internal/benchkit"
)

// attack is one kind of hostile client; run keeps it going until ctx ends
// and then lets go of everything it holds.
type attack struct {
	name string
	what string
	run  func(ctx context.Context, e *env, st *attackStats)
}

func attacks() []attack {
	return []attack{
		{"malformed-v2", "protocol v2 sessions that send a malformed pkt-line header (`zzzz`, `0003`, `fff1`, `ffff`) after the request: over git:// 2 slots that hang up at once and 2 that stay connected, over SSH (eve's key, GIT_PROTOCOL=version=2) 2 that stay connected; each reopened as soon as it ends", malformedV2},
		{"idle-connections", "100 TCP connections to each listener (git://, HTTP, SSH) that send nothing, reopened as soon as the server closes one", idleConnections},
		{"v0-trickle", "100 git:// protocol v0 sessions (the whole --max-connections) that read the advertisement, then send their want line at 1 byte/s", v0Trickle},
		{"push-trickle", "eve (write on eve/* only) runs 4 HTTP pushes to eve/pet, each sending its pack at 1 byte/s", pushTrickle},
		{"body-spool", "10 anonymous HTTP fetch bodies of 20 MiB each: all but the last bytes sent at once, then 1 byte/s", bodySpool},
	}
}

func attackNames() []string {
	var names []string
	for _, a := range attacks() {
		names = append(names, a.name)
	}
	return names
}

// attackStats counts what the attacker saw.
type attackStats struct {
	opened, refused, cutByServer atomic.Int64
	resetConnecting              int64 // dials the server reset (closed at accept) before they ended
	mu                           sync.Mutex
	firstRefusal                 string
}

func (s *attackStats) refuse(msg string) {
	s.refused.Add(1)
	s.mu.Lock()
	if s.firstRefusal == "" {
		s.firstRefusal = strings.ReplaceAll(strings.TrimSpace(msg), "|", "/")
		if len(s.firstRefusal) > 90 {
			s.firstRefusal = s.firstRefusal[:90] + "..."
		}
	}
	s.mu.Unlock()
}

func (s *attackStats) String() string {
	t := fmt.Sprintf("%d opened, %d cut by the server, %d refused", s.opened.Load(), s.cutByServer.Load(), s.refused.Load())
	if s.resetConnecting > 0 {
		t += fmt.Sprintf(", %d more reset while connecting", s.resetConnecting)
	}
	if s.firstRefusal != "" {
		t += fmt.Sprintf(" (`%s`)", s.firstRefusal)
	}
	return t
}

// slots runs n copies of one attacking client, each started again when it
// ends (after a short pause, so a refused attacker does not spin).
func slots(ctx context.Context, n int, one func(ctx context.Context, slot int)) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for ctx.Err() == nil {
				one(ctx, i)
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}(i)
	}
	wg.Wait()
}

func (e *env) dial(ctx context.Context, port string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(e.attacker)}, Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", "127.0.0.1:"+port)
	if errors.Is(err, syscall.ECONNRESET) {
		e.resets.Add(1) // closed at accept (a penalized address) before the dial returned
	}
	return c, err
}

// hold keeps conn open until ctx ends or the server closes it, counting a
// server's close; whatever the server says first is noted as a refusal
// when it is an error.
func hold(ctx context.Context, conn net.Conn, st *attackStats) {
	closed := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		first := true
		for {
			n, err := conn.Read(buf)
			if first && n > 0 && bytes.Contains(buf[:n], []byte("ERR ")) {
				st.refuse(string(buf[bytes.Index(buf[:n], []byte("ERR ")):n]))
			}
			first = false
			if err != nil {
				close(closed)
				return
			}
		}
	}()
	select {
	case <-ctx.Done():
	case <-closed:
		st.cutByServer.Add(1)
	}
	conn.Close()
}

func pkt(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }

var malformed = []string{"zzzz", "0003", "fff1", "ffff"}

func malformedV2(ctx context.Context, e *env, st *attackStats) {
	request := pkt("git-upload-pack /team/app.git\x00host=x\x00\x00version=2\x00")
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { // hang up at once
		defer wg.Done()
		slots(ctx, 2, func(ctx context.Context, slot int) {
			conn, err := e.dial(ctx, e.git)
			if err != nil {
				return
			}
			st.opened.Add(1)
			io.WriteString(conn, request+malformed[int(st.opened.Load())%len(malformed)])
			conn.Close()
		})
	}()
	go func() { // stay connected
		defer wg.Done()
		slots(ctx, 2, func(ctx context.Context, slot int) {
			conn, err := e.dial(ctx, e.git)
			if err != nil {
				return
			}
			st.opened.Add(1)
			io.WriteString(conn, request+malformed[slot%len(malformed)])
			hold(ctx, conn, st)
		})
	}()
	go func() { // over SSH
		defer wg.Done()
		slots(ctx, 2, func(ctx context.Context, slot int) {
			client, err := e.sshClient(ctx)
			if err != nil {
				st.refuse(err.Error())
				return
			}
			defer client.Close()
			sess, err := client.NewSession()
			if err != nil {
				return
			}
			sess.Setenv("GIT_PROTOCOL", "version=2")
			stdin, _ := sess.StdinPipe()
			var stderr bytes.Buffer
			sess.Stderr = &stderr
			sess.Stdout = io.Discard
			if sess.Start("git-upload-pack 'team/app.git'") != nil {
				return
			}
			st.opened.Add(1)
			io.WriteString(stdin, malformed[slot%len(malformed)])
			ended := make(chan struct{})
			go func() { sess.Wait(); close(ended) }()
			select {
			case <-ctx.Done():
			case <-ended:
				st.cutByServer.Add(1)
				if stderr.Len() > 0 {
					st.refuse(stderr.String())
				}
			}
		})
	}()
	wg.Wait()
}

func (e *env) sshClient(ctx context.Context) (*ssh.Client, error) {
	keyBytes, err := os.ReadFile(e.eveKey)
	if err != nil {
		return nil, err
	}
	signer, err := ssh.ParsePrivateKey(keyBytes)
	if err != nil {
		return nil, err
	}
	conn, err := e.dial(ctx, e.ssh)
	if err != nil {
		return nil, err
	}
	cfg := &ssh.ClientConfig{User: "git", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second}
	c, chans, reqs, err := ssh.NewClientConn(conn, "127.0.0.1:"+e.ssh, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return ssh.NewClient(c, chans, reqs), nil
}

func idleConnections(ctx context.Context, e *env, st *attackStats) {
	var wg sync.WaitGroup
	for _, port := range []string{e.git, e.http, e.ssh} {
		wg.Add(1)
		go func(port string) {
			defer wg.Done()
			slots(ctx, 100, func(ctx context.Context, slot int) {
				conn, err := e.dial(ctx, port)
				if err != nil {
					return
				}
				st.opened.Add(1)
				hold(ctx, conn, st)
			})
		}(port)
	}
	wg.Wait()
}

// trickle writes s to w one byte a second until ctx ends or a write fails.
func trickle(ctx context.Context, w io.Writer, s string) error {
	for i := 0; i < len(s); i++ {
		if _, err := w.Write([]byte{s[i]}); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return nil
}

func v0Trickle(ctx context.Context, e *env, st *attackStats) {
	head := strings.TrimSpace(benchkit.Output("git", "-C", filepath.Join(e.data, "repos", "team", "app.git"), "rev-parse", "HEAD"))
	slots(ctx, 100, func(ctx context.Context, slot int) {
		conn, err := e.dial(ctx, e.git)
		if err != nil {
			return
		}
		st.opened.Add(1)
		io.WriteString(conn, pkt("git-upload-pack /team/app.git\x00host=x\x00"))
		// Read the advertisement to its flush, then trickle.
		if msg := readAdvertisement(conn); msg != "" {
			st.refuse(msg)
			conn.Close()
			return
		}
		go trickle(ctx, conn, pkt("want "+head+" ofs-delta\n")+"0000"+pkt("done\n"))
		hold(ctx, conn, st)
	})
}

// readAdvertisement reads pkt-lines up to the first flush; it returns
// the server's ERR line if it sent one first.
func readAdvertisement(conn net.Conn) string {
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	hdr := make([]byte, 4)
	for first := true; ; first = false {
		if _, err := io.ReadFull(conn, hdr); err != nil {
			return ""
		}
		var n int
		fmt.Sscanf(string(hdr), "%04x", &n)
		if n == 0 || n < 4 || n > 65520 {
			return ""
		}
		line := make([]byte, n-4)
		if _, err := io.ReadFull(conn, line); err != nil {
			return ""
		}
		if first && bytes.HasPrefix(line, []byte("ERR ")) {
			return string(line)
		}
	}
}

// slowBody is a request body: prefix at once, then rest one byte a second.
type slowBody struct {
	ctx          context.Context
	prefix, rest []byte
}

func (b *slowBody) Read(p []byte) (int, error) {
	if len(b.prefix) > 0 {
		n := copy(p, b.prefix)
		b.prefix = b.prefix[n:]
		return n, nil
	}
	if len(b.rest) == 0 {
		return 0, io.EOF
	}
	select {
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	case <-time.After(time.Second):
	}
	p[0] = b.rest[0]
	b.rest = b.rest[1:]
	return 1, nil
}

// post sends body to path on the HTTP listener from the attacker's address
// and notes the server's answer.
func (e *env) post(ctx context.Context, path, contentType, user, pass string, body io.Reader, st *attackStats) {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return e.dial(ctx, e.http) }}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://127.0.0.1:"+e.http+path, body)
	req.Header.Set("Content-Type", contentType)
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	st.opened.Add(1)
	resp, err := tr.RoundTrip(req)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		st.cutByServer.Add(1)
		return
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != 200 {
		st.refuse(fmt.Sprintf("%d %s", resp.StatusCode, msg))
	} else if i := bytes.Index(msg, []byte("error")); i >= 0 {
		st.refuse(string(msg[i:]))
	} else {
		st.cutByServer.Add(1)
	}
}

func pushTrickle(ctx context.Context, e *env, st *attackStats) {
	pack, commit := evePack(e)
	slots(ctx, 4, func(ctx context.Context, slot int) {
		cmd := pkt(fmt.Sprintf("%s %s refs/heads/trickle-%d\x00report-status side-band-64k agent=hostile\n", strings.Repeat("0", 40), commit, slot)) + "0000"
		body := &slowBody{ctx: ctx, prefix: []byte(cmd), rest: pack}
		e.post(ctx, "/eve/pet.git/git-receive-pack", "application/x-git-receive-pack-request", "eve", e.eveToken, body, st)
	})
}

// evePack is a pack of one commit with a 64 KiB incompressible blob, for
// eve/pet, and the commit's id.
func evePack(e *env) ([]byte, string) {
	dir := filepath.Join(e.out, "eve-work")
	os.RemoveAll(dir)
	benchkit.Run("git", "init", "-q", dir)
	blob := make([]byte, 64<<10)
	f, _ := os.Open("/dev/urandom")
	io.ReadFull(f, blob)
	f.Close()
	os.WriteFile(filepath.Join(dir, "big.bin"), blob, 0o644)
	benchkit.Run("git", "-C", dir, "add", "big.bin")
	benchkit.Run("git", "-C", dir, "-c", "user.name=eve", "-c", "user.email=eve@x", "commit", "-q", "-m", "trickle")
	commit := strings.TrimSpace(benchkit.Output("git", "-C", dir, "rev-parse", "HEAD"))
	cmd := exec.Command("git", "-C", dir, "pack-objects", "--stdout", "--revs", "-q")
	cmd.Stdin = strings.NewReader("HEAD\n")
	pack, err := cmd.Output()
	if err != nil {
		benchkit.Fatalf("pack-objects: %v", err)
	}
	return pack, commit
}

func bodySpool(ctx context.Context, e *env, st *attackStats) {
	head := strings.TrimSpace(benchkit.Output("git", "-C", filepath.Join(e.data, "repos", "team", "app.git"), "rev-parse", "HEAD"))
	var b strings.Builder
	b.WriteString(pkt("want " + head + " ofs-delta\n"))
	b.WriteString("0000")
	have := pkt("have " + strings.Repeat("1", 40) + "\n")
	for b.Len() < 20<<20 {
		b.WriteString(have)
	}
	body := []byte(b.String())
	slots(ctx, 10, func(ctx context.Context, slot int) {
		sb := &slowBody{ctx: ctx, prefix: body[:len(body)-64], rest: body[len(body)-64:]}
		e.post(ctx, "/team/app.git/git-upload-pack", "application/x-git-upload-pack-request", "", "", sb, st)
	})
}
