package server

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"packwire/internal/governor"
	"packwire/internal/pktline"
)

// TestLimiterOverEachTransport holds the only pack slot with a git://
// clone that never reads its pack, then checks that a clone over
// each transport waits, is refused in git's words, and is recorded, while
// ls-remote over every transport goes through: a session takes its slot at
// its "done", not at connect.
func TestLimiterOverEachTransport(t *testing.T) {
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, func(c *Config) {
		enableSSH(c)
		c.MaxPackJobs, c.MaxPackJobsPerRepo, c.MaxQueueWait = 1, 1, 300*time.Millisecond
	})
	sshEnv := sshEnvFor(s)
	teamHead := s.env.RevParse(s.seed(t, "team/app"), "HEAD")
	s.bigRepo(t, "big")

	// A clone of another repository that stops reading holds the one slot.
	hold, err := net.Dial("tcp", s.GitAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	hold.Write(request("git-upload-pack", "/big", ""))
	pr := pktline.NewReader(hold)
	var head string
	for { // the advertisement, to its flush: no slot yet
		kind, line, err := pr.Read()
		if err != nil {
			t.Fatal(err)
		}
		if kind != pktline.Data {
			break
		}
		if head == "" {
			head = string(line[:40])
		}
	}
	waitRunning := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for running, _ := s.Pipeline.Limiter.Stats(); running != n; running, _ = s.Pipeline.Limiter.Stats() {
			if time.Now().After(deadline) {
				t.Fatalf("limiter runs %d, want %d", running, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitRunning(0)
	pktline.Write(hold, []byte("want "+head+"\n"))
	pktline.WriteFlush(hold)
	waitRunning(0)                        // wants alone take no slot: no pack yet
	pktline.Write(hold, []byte("done\n")) // the pack starts here, and this client never reads it
	waitRunning(1)

	// ls-remote needs no pack slot over any transport.
	for _, url := range []string{s.gitURL("team/app"), s.httpURL("team/app"), s.sshURL("team/app")} {
		for _, proto := range []string{"0", "2"} {
			if out, err := s.env.Run("", sshEnv, "-c", "protocol.version="+proto, "ls-remote", url); err != nil || !strings.Contains(out, teamHead) {
				t.Fatalf("ls-remote v%s %s while the slot is held: %v\n%s", proto, url, err, out)
			}
		}
	}

	for _, c := range []struct{ transport, url, want string }{
		{"git", s.gitURL("team/app"), "fatal: remote error: server busy: waited "},
		// git does not print the body of a failed POST, only the status.
		{"http", s.httpURL("team/app"), "HTTP 503"},
		{"ssh", s.sshURL("team/app"), "server busy: waited "},
	} {
		seq := s.lastSeq(t)
		start := time.Now()
		out, err := s.env.Run(t.TempDir(), sshEnv, "clone", c.url, "c")
		message := c.transport == "http" || strings.Contains(out, "in the queue for team/app") && strings.Contains(out, "retry in")
		if err == nil || !strings.Contains(out, c.want) || !message {
			t.Fatalf("%s: err=%v\n%s", c.transport, err, out)
		}
		if d := time.Since(start); d < 300*time.Millisecond {
			t.Fatalf("%s refused after %v, before the queue wait", c.transport, d)
		}
		recs := s.recordsAfter(t, seq, func(r []governor.Record) bool {
			for _, x := range r {
				if x.Result == governor.ResultRefused && strings.Contains(x.Error, "server busy") {
					return true
				}
			}
			return false
		})
		for _, r := range recs {
			if r.Result == governor.ResultRefused && time.Duration(r.QueueWait) < 300*time.Millisecond {
				t.Fatalf("%s: queue wait not recorded: %+v", c.transport, r)
			}
		}
	}

	// HTTP says when to come back.
	resp, err := (&netHTTPClient{}).post(fmt.Sprintf("http://%s/team/app/git-upload-pack", s.HTTPAddr))
	if err != nil {
		t.Fatal(err)
	}
	if resp.status != 503 || resp.retryAfter == "" || resp.retryAfter == "0" || !strings.HasPrefix(resp.body, "server busy: waited ") {
		t.Fatalf("HTTP refusal: %d Retry-After %q body %q", resp.status, resp.retryAfter, resp.body)
	}

	// Once the slot is free, clones go through again.
	hold.Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		out, err := s.env.Run(t.TempDir(), nil, "clone", s.gitURL("team/app"), "c")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot never released: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type netHTTPClient struct{}

type simpleResponse struct {
	status     int
	retryAfter string
	body       string
}

func (netHTTPClient) post(url string) (simpleResponse, error) {
	resp, err := httpPost(url, "application/x-git-upload-pack-request", "0000")
	if err != nil {
		return simpleResponse{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return simpleResponse{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b)}, nil
}

func httpPost(url, contentType, body string) (*http.Response, error) {
	return http.Post(url, contentType, strings.NewReader(body))
}
