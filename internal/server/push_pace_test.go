package server

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"packwire/internal/pktline"
)

// newPack makes a commit in a work tree of bare and returns its id, the
// commands pushing it to ref, and a real pack of it.
func (a *accessServer) newPack(t *testing.T, bare, ref, caps string) (cmds, pack []byte) {
	t.Helper()
	w := a.work(t, bare)
	old := a.env.RevParse(w, "HEAD")
	head := a.commit(w, "pushed slowly "+ref)
	cmd := exec.Command("git", "pack-objects", "--stdout", "--revs")
	cmd.Dir = w
	cmd.Stdin = strings.NewReader(head + "\n^" + old + "\n")
	pack, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	return pushCommands(caps, zeroID+" "+head+" "+ref), pack
}

// trickledHTTPPush starts a push whose commands arrive at once and whose
// pack then trickles a byte every interval (chunked), until stop.
func (a *accessServer) trickledHTTPPush(t *testing.T, who *actor, repo string, cmds, pack []byte, interval time.Duration, stop <-chan struct{}, wg *sync.WaitGroup) net.Conn {
	t.Helper()
	conn := rawHTTP(t, a.HTTPAddr.String(), "POST", "/"+repo+"/git-receive-pack",
		"Authorization: Basic "+basicAuth(who.name, who.token),
		"Content-Type: application/x-git-receive-pack-request", "Transfer-Encoding: chunked")
	conn.Write([]byte(fmt.Sprintf("%x\r\n%s\r\n", len(cmds), cmds)))
	wg.Add(1)
	go func() { defer wg.Done(); trickle(conn, pack, true, interval, stop) }()
	return conn
}

// TestTrickledPushIsCut: a writer whose push pack trickles (a real pack,
// a byte every 200 ms, after its commands came at once) is cut once it
// falls behind --request-min-rate after the grace, over HTTP (408) and
// SSH (stderr, non-zero exit), and its push slot and receive-pack are
// gone. On the old server nothing paced a push: the trickle held its slot
// until the idle timeout.
func TestTrickledPushIsCut(t *testing.T) {
	s := startAccessServerWith(t, func(c *Config) {
		c.InitTimeout, c.RequestMinRate, c.IdleTimeout = 2*time.Second, 1024, 5*time.Minute
	})
	bare := s.seed(t, "team/app")
	s.grant(t, "alice", "write", "**")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()

	t.Run("http", func(t *testing.T) {
		cmds, pack := s.newPack(t, bare, "refs/heads/slow-http", "report-status side-band-64k")
		start := time.Now()
		conn := s.trickledHTTPPush(t, s.alice, "team/app", cmds, pack, 200*time.Millisecond, stop, &wg)
		status, text, err := response(conn, 20*time.Second)
		if err != nil || status != http.StatusRequestTimeout || !strings.Contains(text, "push too slow") {
			t.Fatalf("trickled HTTP push: status %d %q, err %v", status, text, err)
		}
		t.Logf("HTTP push cut after %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(text))
	})

	t.Run("ssh", func(t *testing.T) {
		cmds, pack := s.newPack(t, bare, "refs/heads/slow-ssh", "report-status side-band-64k")
		keyPEM, err := os.ReadFile(s.alice.key)
		if err != nil {
			t.Fatal(err)
		}
		signer, err := gossh.ParsePrivateKey(keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		client, err := gossh.Dial("tcp", s.SSHAddr.String(), &gossh.ClientConfig{User: "git", Auth: []gossh.AuthMethod{gossh.PublicKeys(signer)},
			HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		sess, err := client.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		sess.Stderr = &stderr
		stdin, _ := sess.StdinPipe()
		stdout, _ := sess.StdoutPipe()
		if err := sess.Start("git-receive-pack 'team/app'"); err != nil {
			t.Fatal(err)
		}
		r := pktline.NewReader(stdout)
		for { // the advertisement
			kind, _, err := r.Read()
			if err != nil {
				t.Fatalf("advertisement: %v", err)
			}
			if kind == pktline.Flush {
				break
			}
		}
		start := time.Now()
		stdin.Write(cmds)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i = (i + 1) % len(pack) {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				if _, err := stdin.Write(pack[i : i+1]); err != nil {
					return
				}
			}
		}()
		done := make(chan error, 1)
		go func() { done <- sess.Wait() }()
		select {
		case err := <-done:
			if _, ok := err.(*gossh.ExitError); !ok || !strings.Contains(stderr.String(), "push too slow") {
				t.Fatalf("trickled SSH push ended with %v, stderr %q", err, stderr.String())
			}
		case <-time.After(20 * time.Second):
			t.Fatal("trickled SSH push still running 20s later")
		}
		t.Logf("SSH push cut after %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr.String()))
	})

	s.waitNoChildren(t, "receive-pack", 5*time.Second)
	if running, _ := s.Pipeline.Pushes.Stats(); running != 0 {
		t.Fatalf("%d push slots still held", running)
	}
	for _, ref := range []string{"refs/heads/slow-http", "refs/heads/slow-ssh"} {
		if refOf(s, bare, ref) != "" {
			t.Errorf("%s written", ref)
		}
	}
	// A real push still goes through.
	w := s.work(t, bare)
	s.commit(w, "honest")
	for _, transport := range pushTransports {
		if out, err := s.git(t, w, transport, s.alice, "team/app", "push", "URL", "HEAD:refs/heads/honest-"+transport); err != nil {
			t.Fatalf("push over %s: %v\n%s", transport, err, out)
		}
	}
}

// TestPushesPerUser: a writer on eve/** only who holds her share of the
// push slots (here 1 of 2: a pack trickled within the pace) has her other
// pushes wait for her own to end, and refused after the queue wait in
// git's words, while another user's pushes, over HTTP and SSH, run at
// once. On the old server two of eve's trickles held both slots and every
// other push waited in the queue, then got "server busy: waited ...".
func TestPushesPerUser(t *testing.T) {
	s := startAccessServerWith(t, func(c *Config) {
		c.MaxPushJobs, c.MaxPushesPerUser, c.MaxQueueWait = 2, 1, 3*time.Second
		c.InitTimeout, c.RequestMinRate = 60*time.Second, 1024
	})
	s.seed(t, "eve/pet")
	bare := s.seed(t, "team/app")
	eve := s.addUser(t, "eve")
	s.grant(t, "eve", "write", "eve/**")
	s.grant(t, "alice", "admin", "**")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()

	petBare := s.Data.Repos.PathFor("eve/pet")
	waitPushes := func(what string, ok func(running, queued int) bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			running, queued := s.Pipeline.Pushes.Stats()
			if ok(running, queued) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d pushes running, %d queued", what, running, queued)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i := 0; i < 2; i++ {
		cmds, pack := s.newPack(t, petBare, fmt.Sprintf("refs/heads/hold%d", i), "report-status side-band-64k")
		s.trickledHTTPPush(t, eve, "eve/pet", cmds, pack, 500*time.Millisecond, stop, &wg)
		waitPushes(fmt.Sprintf("eve's push %d neither admitted nor queued", i), func(running, queued int) bool { return running+queued == i+1 })
	}
	if running, _ := s.Pipeline.Pushes.Stats(); running != 1 {
		t.Fatalf("eve holds %d push slots, want 1", running)
	}
	// alice pushes at once, over each transport.
	w := s.work(t, bare)
	s.commit(w, "while eve trickles")
	for _, transport := range pushTransports {
		start := time.Now()
		out, err := s.git(t, w, transport, s.alice, "team/app", "push", "URL", "HEAD:refs/heads/from-"+transport)
		if err != nil {
			t.Fatalf("alice's push over %s while eve holds her share: %v\n%s", transport, err, out)
		}
		// On the old server it waited the whole queue wait, then failed.
		t.Logf("alice's push over %s while eve holds her share: %v", transport, time.Since(start).Round(time.Millisecond))
	}
	// Eve's next push (its pack sent whole) waits for her own, then is
	// refused in git's report.
	cmds, pack := s.newPack(t, petBare, "refs/heads/third", "report-status side-band-64k")
	report := s.rawHTTPPush(t, eve, "eve/pet", append(cmds, pack...))
	if !strings.Contains(report, "ng refs/heads/third server busy: too many pushes running from eve (max 1): waited 3s in the queue") {
		t.Fatalf("eve's push over her share: %s", report)
	}
}
