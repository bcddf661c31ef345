package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"packwire/bench/internal/benchkit"
	pwssh "packwire/internal/transport/ssh"
)

// sshFloorWorkload measures what one SSH connection costs a server apart
// from git, to tell how much of packwire's per-connection cost over SSH is
// its own: the OpenSSH client runs the same command against
//   - packwire: `git-upload-pack` with GIT_PROTOCOL=version=2 and a flush
//     on stdin, which packwire answers itself (the capability
//     advertisement; no git runs);
//   - a bare server made of golang.org/x/crypto/ssh alone (this program,
//     re-executed in its own cgroup; see serveBareSSH): an ed25519 host
//     key, public-key authentication, and the exec answered with the same
//     bytes packwire sent, then exit status 0;
//   - OpenSSH sshd, whose git-shell starts git-upload-pack (for scale: it
//     forks a process per connection and runs git).
//
// Each round runs, per server in a fresh random order, n connections one
// after another and n at once; server CPU (its cgroup) per connection.
func (s *setup) sshFloorWorkload(r *report, n int) {
	log.Printf("sshfloor: what one SSH connection costs ...")
	stdin := filepath.Join(s.out, "flush.pkt")
	if err := os.WriteFile(stdin, []byte("0000"), 0o644); err != nil {
		benchkit.Fatalf("%v", err)
	}
	sshArgs := func(user, port, command string) []string {
		args := strings.Fields(benchkit.SSHCommand(s.key, ""))[1:]
		return append(args, "-o", "SetEnv=GIT_PROTOCOL=version=2", "-p", port, user+"@127.0.0.1", command)
	}
	pwCmd := sshArgs("bench", s.pwSSH, "git-upload-pack '/"+s.repo+".git'")
	reply, err := runSSH(pwCmd, stdin)
	if err != nil || !bytes.Contains(reply, []byte("version 2")) {
		benchkit.Fatalf("sshfloor: packwire's answer: %v\n%q", err, reply)
	}
	replyFile := filepath.Join(s.out, "sshfloor-reply")
	os.WriteFile(replyFile, reply, 0o644)

	barePort, g, stop := s.startBareSSH(replyFile)
	defer stop()
	bareCmd := sshArgs("git", barePort, "git-upload-pack '/"+s.repo+".git'")
	if got, err := runSSH(bareCmd, stdin); err != nil || !bytes.Equal(got, reply) {
		benchkit.Fatalf("sshfloor: the bare server's answer: %v\n%q", err, got)
	}
	sshdCmd := sshArgs(benchkit.SSHDUser, s.sshd.Port, "git-upload-pack '"+s.repos+"/"+s.repo+".git'")
	if _, err := runSSH(sshdCmd, stdin); err != nil {
		benchkit.Fatalf("sshfloor: sshd's answer: %v", err)
	}

	type target struct {
		name  string
		group *benchkit.Group
		args  []string
		one   []time.Duration // CPU per connection, one after another, per round
		herd  []time.Duration // CPU per connection, n at once, per round
		errs  int
	}
	// A clone's worth of bytes from the bare server: what sending one
	// answer of the benchmark repository's pack size costs the library.
	packBytes := benchkit.DirSize(filepath.Join(s.repos, s.repo+".git", "objects", "pack"))
	streamName := fmt.Sprintf("bare x/crypto/ssh server, %.1f MiB answer", float64(packBytes)/(1<<20))
	targets := []*target{
		{name: "packwire", group: s.packwire.Group, args: pwCmd},
		{name: "bare x/crypto/ssh server", group: g, args: bareCmd},
		{name: "OpenSSH sshd + git", group: s.sshd.Group, args: sshdCmd},
		{name: streamName, group: g, args: sshArgs("git", barePort, fmt.Sprintf("stream %d", packBytes))},
	}
	for round := 0; round <= s.nRounds; round++ { // round 0 warms up
		order := mrand.Perm(len(targets))
		for _, i := range order {
			t := targets[i]
			cpu := t.group.Read()
			for j := 0; j < n; j++ {
				if _, err := runSSH(t.args, stdin); err != nil {
					t.errs++
				}
			}
			one := (t.group.Read() - cpu) / time.Duration(n)
			cpu = t.group.Read()
			var wg sync.WaitGroup
			var mu sync.Mutex
			for j := 0; j < n; j++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := runSSH(t.args, stdin); err != nil {
						mu.Lock()
						t.errs++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			herd := (t.group.Read() - cpu) / time.Duration(n)
			if round > 0 {
				t.one, t.herd = append(t.one, one), append(t.herd, herd)
			}
			fmt.Fprintf(os.Stderr, "\rsshfloor round %d/%d %-42s one %5.2f ms herd %5.2f ms   ", round, s.nRounds, t.name, msf(one), msf(herd))
		}
	}
	fmt.Fprintln(os.Stderr)

	r.section("SSH: what one connection costs, apart from git",
		fmt.Sprintf("The OpenSSH client (`%s -o SetEnv=GIT_PROTOCOL=version=2`) runs `git-upload-pack` with a flush on stdin against: packwire, which answers it itself (the protocol v2 capability advertisement: no git runs); "+
			"a bare server made of golang.org/x/crypto/ssh alone (bench/peers re-executed in its own cgroup: an ed25519 host key, packwire's cipher offer (AES only), public-key authentication, the exec answered with the same %d bytes packwire sent, exit status 0, nothing else); "+
			"and OpenSSH sshd, whose git-shell runs git-upload-pack. The last row is the bare server sending as many random bytes as the benchmark repository's packs hold (a clone's answer), whatever the command. Server CPU per connection (cgroup delta / %d): %d connections one after another, then %d at once; %d rounds after a warm-up, servers in a fresh random order per round; medians.",
			benchkit.SSHCommand("KEY", ""), len(reply), n, n, n, s.nRounds))
	r.table("| server | one after another | "+fmt.Sprint(n)+" at once | errors |", "|---|---:|---:|---:|")
	for _, t := range targets {
		r.row(t.name, fmt.Sprintf("%.2f ms", msf(benchkit.Median(t.one))), fmt.Sprintf("%.2f ms", msf(benchkit.Median(t.herd))), fmt.Sprint(t.errs))
	}
	pw, bare := targets[0], targets[1]
	r.note(fmt.Sprintf("packwire / bare x/crypto/ssh: %.2fx one after another, %.2fx at once; packwire's own part of a connection: %.2f ms and %.2f ms.",
		durRatio(benchkit.Median(pw.one), benchkit.Median(bare.one)), durRatio(benchkit.Median(pw.herd), benchkit.Median(bare.herd)),
		msf(benchkit.Median(pw.one)-benchkit.Median(bare.one)), msf(benchkit.Median(pw.herd)-benchkit.Median(bare.herd))))
	// With the storm's herds in the same run: a herd of n over SSH costs at
	// least what one costs and n-1 more connections at the bare library's
	// cost (the git run is shared; a connection and its encryption are
	// not). A cold clone's followers each receive the whole answer, for
	// which the bare server's streaming row stands.
	stream := targets[3]
	for _, v := range []string{"SSH v0", "SSH v2"} {
		if one, ok := s.ciOneFetch[v]; ok && one > 0 {
			floor := one + time.Duration(n-1)*benchkit.Median(bare.herd)
			r.note(fmt.Sprintf("Floor of %d CI runners' fetches over %s with x/crypto/ssh (this run): one fetch (%.1f ms, storm workload) + %d connections at the bare server's cost at once (%.2f ms each) = %.1f ms, %.2fx one fetch.",
				n, v, msf(one), n-1, msf(benchkit.Median(bare.herd)), msf(floor), durRatio(floor, one)))
		}
		if one, ok := s.coldOneClone[v]; ok && one > 0 {
			floor := one + time.Duration(n-1)*benchkit.Median(stream.herd)
			r.note(fmt.Sprintf("Floor of %d cold clones over %s with x/crypto/ssh (this run): one clone (%.1f ms, storm workload) + %d connections streaming a clone's worth at the bare server's cost at once (%.2f ms each) = %.1f ms, %.2fx one clone.",
				n, v, msf(one), n-1, msf(benchkit.Median(stream.herd)), msf(floor), durRatio(floor, one)))
		}
	}
}

// startBareSSH starts serveBareSSH (this program again) in its own cgroup,
// answering every exec with the contents of replyFile, and returns its port,
// its group and what stops it.
func (s *setup) startBareSSH(replyFile string) (port string, g *benchkit.Group, stop func()) {
	self, err := os.Executable()
	if err != nil {
		benchkit.Fatalf("%v", err)
	}
	port = benchkit.FreePort()
	g = benchkit.NewGroup("bare-ssh")
	cmd := g.Command(self, "-bare-ssh-serve", "127.0.0.1:"+port, "-bare-ssh-reply", replyFile, "-bare-ssh-key", s.key+".pub")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		g.Close()
		benchkit.Fatalf("%v", err)
	}
	benchkit.WaitPort(port)
	return port, g, func() { cmd.Process.Kill(); cmd.Wait(); g.Close() }
}

// msf is d in milliseconds, with two decimals' worth of precision kept.
func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func durRatio(a, b time.Duration) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// runSSH runs the OpenSSH client with args, stdin from the file stdin, and
// returns what it wrote to stdout.
func runSSH(args []string, stdin string) ([]byte, error) {
	in, err := os.Open(stdin)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	cmd := exec.Command("ssh", args...)
	cmd.Stdin = in
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%v: %s", err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// serveBareSSH is the bare server of sshFloorWorkload: golang.org/x/crypto/ssh
// with nothing else but packwire's cipher offer. It accepts the one key in authorizedKey, answers every
// exec with reply ("stream N": N random bytes instead; "cat PATH": the
// file's bytes, read once), reads the client's
// input to its end, sends exit status 0, EOF and close (packwire's order),
// and refuses everything else.
func serveBareSSH(addr, replyFile, authorizedKey string) {
	reply, err := os.ReadFile(replyFile)
	if err != nil {
		log.Fatal(err)
	}
	pubBytes, err := os.ReadFile(authorizedKey)
	if err != nil {
		log.Fatal(err)
	}
	allowed, _, _, _, err := ssh.ParseAuthorizedKey(pubBytes)
	if err != nil {
		log.Fatal(err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	hostKey, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		log.Fatal(err)
	}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if bytes.Equal(k.Marshal(), allowed.Marshal()) {
			return nil, nil
		}
		return nil, errors.New("unknown key")
	}}
	cfg.AddHostKey(hostKey)
	// packwire's cipher offer, so that the client picks the same cipher
	// and MAC from both (OpenSSH: aes128-ctr with hmac-sha2-256-etm; with
	// x/crypto's defaults it would take chacha20-poly1305, ~5x the CPU per
	// byte, and the streaming row would not compare).
	cfg.Ciphers = pwssh.DefaultCiphers
	l, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	for {
		nc, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go serveBareConn(nc, cfg, reply)
	}
}

var randomMu sync.Mutex
var randomBuf []byte

// randomBytes returns n incompressible bytes (like a pack's), made once:
// the bare server's CPU is the library's, not the generator's.
func randomBytes(n int) []byte {
	randomMu.Lock()
	defer randomMu.Unlock()
	if len(randomBuf) < n {
		randomBuf = make([]byte, n)
		mrand.NewChaCha8([32]byte{}).Read(randomBuf)
	}
	return randomBuf[:n]
}

var filesMu sync.Mutex
var files = map[string][]byte{}

// fileBytes returns the contents of path, read once: the bare server's
// CPU is the library's, not the file system's.
func fileBytes(path string) []byte {
	filesMu.Lock()
	defer filesMu.Unlock()
	if b, ok := files[path]; ok {
		return b
	}
	b, err := os.ReadFile(path)
	if err != nil {
		log.Printf("bare ssh server: %v", err)
	}
	files[path] = b
	return b
}

func serveBareConn(nc net.Conn, cfg *ssh.ServerConfig, reply []byte) {
	defer nc.Close()
	sc, chans, reqs, err := ssh.NewServerConn(nc, cfg)
	if err != nil {
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nch := range chans {
		if nch.ChannelType() != "session" {
			nch.Reject(ssh.UnknownChannelType, "sessions only")
			continue
		}
		ch, creqs, err := nch.Accept()
		if err != nil {
			continue
		}
		go func() {
			for req := range creqs {
				switch req.Type {
				case "env":
					req.Reply(true, nil)
				case "exec":
					req.Reply(true, nil)
					var cmd struct{ Command string }
					ssh.Unmarshal(req.Payload, &cmd)
					out := reply
					if n, ok := strings.CutPrefix(cmd.Command, "stream "); ok {
						size, _ := strconv.Atoi(n)
						out = randomBytes(size)
					} else if path, ok := strings.CutPrefix(cmd.Command, "cat "); ok {
						out = fileBytes(path)
					}
					go func() {
						ch.Write(out)
						io.Copy(io.Discard, ch)
						ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{0}))
						ch.CloseWrite()
						ch.Close()
					}()
				default:
					req.Reply(false, nil)
				}
			}
		}()
	}
}
