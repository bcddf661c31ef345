package hookwire

import (
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// server answers each hook call over a unix socket with answer, and
// hands the requests to the test.
func server(t *testing.T, answer Answer) (string, <-chan Request) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "h.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan Request, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var req Request
			json.NewDecoder(c).Decode(&req)
			got <- req
			json.NewEncoder(c).Encode(answer)
			c.Close()
		}
	}()
	return sock, got
}

const (
	zero = "0000000000000000000000000000000000000000"
	one  = "1111111111111111111111111111111111111111"
)

// TestRunSendsTheUpdatesAndObeysTheVerdict: in "prepared" the hook sends
// the token, the repository and the refs/ updates (not HEAD, not the
// node's own refs/packwire/), and fails the transaction when the server
// refuses, with the server's words.
func TestRunSendsTheUpdatesAndObeysTheVerdict(t *testing.T) {
	sock, got := server(t, Answer{Error: "cluster: only 1 of 3"})
	t.Setenv(EnvSocket, sock)
	t.Setenv(EnvRepo, "team/app")
	t.Setenv(EnvToken, "tok")
	in := strings.NewReader(zero + " " + one + " refs/heads/main\n" + zero + " " + one + " HEAD\n" + zero + " " + one + " refs/packwire/keep\n")
	var stderr strings.Builder
	if code := Run([]string{"prepared"}, in, &stderr); code != 1 || !strings.Contains(stderr.String(), "only 1 of 3") {
		t.Fatalf("refused: exit %d, stderr %q", code, stderr.String())
	}
	req := <-got
	if req.Token != "tok" || req.State != "prepared" || req.Repo != "team/app" || len(req.Updates) != 1 || req.Updates[0] != (Update{zero, one, "refs/heads/main"}) {
		t.Fatalf("request %+v", req)
	}

	sock, got = server(t, Answer{})
	t.Setenv(EnvSocket, sock)
	if code := Run([]string{"committed"}, strings.NewReader(""), &stderr); code != 0 {
		t.Fatalf("committed: exit %d", code)
	}
	if req := <-got; req.State != "committed" || req.Txn == "" {
		t.Fatalf("committed request %+v", req)
	}
}

// TestRunWithoutServer: a push outside a cluster (no socket named) is
// let through; a primary whose server does not answer fails the push.
func TestRunWithoutServer(t *testing.T) {
	t.Setenv(EnvRepo, "")
	t.Setenv(EnvSocket, "")
	if code := Run([]string{"prepared"}, strings.NewReader(zero+" "+one+" refs/heads/main\n"), &strings.Builder{}); code != 0 {
		t.Fatalf("outside a cluster: exit %d", code)
	}
	t.Setenv(EnvRepo, "app")
	t.Setenv(EnvSocket, filepath.Join(t.TempDir(), "none.sock"))
	var stderr strings.Builder
	if code := Run([]string{"prepared"}, strings.NewReader(zero+" "+one+" refs/heads/main\n"), &stderr); code != 1 || !strings.Contains(stderr.String(), "nothing was written") {
		t.Fatalf("no server: exit %d, %q", code, stderr.String())
	}
}
