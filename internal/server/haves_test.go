package server

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestUnreachableObjectsNotConfirmed: once the branch that held a secret
// is deleted, nothing confirms that its commit and blob are still stored,
// over git://, HTTP and SSH, protocol v0 and v2, with the fetch cache on
// and off: a git fetch from a clone that still has the branch gets no ACK
// for its commit (the clone's other haves are ACKed: the fetch after a
// push still negotiates and gets the new commit), a raw fetch's have of
// the blob or commit gets no ACK, and object-info is neither advertised
// nor answered ("invalid command"). Before, upload-pack ACKed both and
// object-info gave their sizes to anyone who could read the repository.
func TestUnreachableObjectsNotConfirmed(t *testing.T) {
	t.Parallel()
	for _, fetchCache := range []bool{true, false} {
		name := "fetch cache"
		if !fetchCache {
			name = "no fetch cache"
		}
		t.Run(name, func(t *testing.T) {
			enableSSH, sshEnvFor := withSSH(t)
			s := startServer(t, func(c *Config) { enableSSH(c); c.FetchCache = fetchCache })
			checkUnreachableNotConfirmed(t, s, sshEnvFor(s))
		})
	}
}

func checkUnreachableNotConfirmed(t *testing.T, s *testServer, sshEnv []string) {
	bare := s.seed(t, "team/app")
	w := filepath.Join(t.TempDir(), "w")
	s.env.Git("", "clone", "-q", s.pushURL("team/app"), w)
	old := s.env.RevParse(w, "HEAD") // reached from main
	s.env.Git(w, "checkout", "-q", "-b", "leak")
	os.WriteFile(filepath.Join(w, "secret.txt"), []byte("the password is hunter2\n"), 0o644)
	s.env.Git(w, "add", "secret.txt")
	s.env.Git(w, "commit", "-qm", "oops")
	secretCommit := s.env.RevParse(w, "HEAD")
	secretBlob := s.env.RevParse(w, "HEAD:secret.txt")
	s.env.Git(w, "push", "-q", "origin", "leak")
	s.env.Git(w, "push", "-q", "origin", ":leak")
	// The clone keeps only the branch: its haves start with the commit.
	for _, ref := range strings.Fields(s.env.Git(w, "for-each-ref", "--format=%(refname)")) {
		if ref != "refs/heads/leak" {
			s.env.Git(w, "update-ref", "-d", ref)
		}
	}
	s.env.Git(bare, "cat-file", "-e", secretBlob) // still stored: only reachability protects it
	// Someone else pushes: the clone's next fetch is an incremental one.
	w2 := filepath.Join(t.TempDir(), "w2")
	s.env.Git("", "clone", "-q", s.pushURL("team/app"), w2)
	s.env.Git(w2, "commit", "-q", "--allow-empty", "-m", "new")
	s.env.Git(w2, "push", "-q", "origin", "main")
	tip := s.env.RevParse(w2, "HEAD")

	for _, url := range []string{s.gitURL("team/app"), s.httpURL("team/app"), s.sshURL("team/app")} {
		for _, v := range []string{"0", "2"} {
			c := filepath.Join(t.TempDir(), "c")
			if out, err := exec.Command("cp", "-a", w, c).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
			out, err := s.env.Run(c, append([]string{"GIT_TRACE_PACKET=1"}, sshEnv...), "-c", "protocol.version="+v, "fetch", url, "main")
			if err != nil {
				t.Fatalf("%s v%s: fetch: %v\n%s", url, v, err, out)
			}
			if !strings.Contains(out, "> have "+secretCommit) {
				t.Fatalf("%s v%s: the clone did not offer the deleted branch's commit:\n%s", url, v, out)
			}
			if strings.Contains(out, "ACK "+secretCommit) {
				t.Errorf("%s v%s: the deleted branch's commit was ACKed", url, v)
			}
			if !strings.Contains(out, "< ACK ") {
				t.Errorf("%s v%s: none of the clone's haves was ACKed: no negotiation\n%s", url, v, out)
			}
			if got := s.env.RevParse(c, "FETCH_HEAD"); got != tip {
				t.Errorf("%s v%s: fetched %s, want %s", url, v, got, tip)
			}
		}
	}

	// Raw v2 requests: a fetch whose haves are the blob, the commit and
	// the old main (no done: git answers with its acknowledgments), and
	// object-info of the blob and the commit.
	fetch := string(mustPkt("command=fetch\n")) + "0001" + string(mustPkt("want "+tip+"\n")) +
		string(mustPkt("have "+secretBlob+"\n")) + string(mustPkt("have "+secretCommit+"\n")) + string(mustPkt("have "+old+"\n")) + "0000"
	info := string(mustPkt("command=object-info\n")) + "0001" + string(mustPkt("size\n")) +
		string(mustPkt("oid "+secretBlob+"\n")) + string(mustPkt("oid "+secretCommit+"\n")) + "0000"
	check := func(how, out string, objectInfo bool) {
		t.Helper()
		for _, id := range []string{secretBlob, secretCommit} {
			if strings.Contains(out, "ACK "+id) || strings.Contains(out, id+" ") && objectInfo {
				t.Errorf("%s: %s confirmed:\n%q", how, id, out)
			}
		}
		if !objectInfo && !strings.Contains(out, "ACK "+old) {
			t.Errorf("%s: the reachable have was not ACKed:\n%q", how, out)
		}
		if objectInfo && !strings.Contains(out, "ERR invalid command 'object-info'") {
			t.Errorf("%s: object-info not refused in git's words:\n%q", how, out)
		}
	}
	for _, body := range []struct {
		name       string
		req        string
		objectInfo bool
	}{{"fetch", fetch, false}, {"object-info", info, true}} {
		out := rawGit(t, s.GitAddr.String(), append(request("git-upload-pack", "/team/app", "\x00version=2\x00"), body.req+"0000"...))
		if strings.Contains(out, "object-info") && !strings.Contains(out, "invalid command") {
			t.Errorf("git://: object-info advertised:\n%q", out)
		}
		check("git:// "+body.name, out, body.objectInfo)
		out = rawSSH(t, s, sshEnv, body.req+"0000")
		if strings.Contains(out, "object-info") && !strings.Contains(out, "invalid command") {
			t.Errorf("ssh: object-info advertised:\n%q", out)
		}
		check("ssh "+body.name, out, body.objectInfo)
		check("http "+body.name, httpV2(t, "POST", s.httpURL("team/app")+"/git-upload-pack", body.req), body.objectInfo)
	}
	if adv := httpV2(t, "GET", s.httpURL("team/app")+"/info/refs?service=git-upload-pack", ""); !strings.Contains(adv, "fetch=") || strings.Contains(adv, "object-info") {
		t.Errorf("http: advertisement:\n%q", adv)
	}
}

// rawSSH runs git-upload-pack for team/app over SSH with protocol v2,
// sends send and returns what came back until the server closed.
func rawSSH(t *testing.T, s *testServer, sshEnv []string, send string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ssh := strings.Fields(strings.TrimPrefix(sshEnv[0], "GIT_SSH_COMMAND="))
	host, port, _ := strings.Cut(s.SSHAddr.String(), ":")
	args := append(ssh[1:], "-o", "SetEnv=GIT_PROTOCOL=version=2", "-p", port, "git@"+host, "git-upload-pack 'team/app'")
	cmd := exec.CommandContext(ctx, ssh[0], args...)
	cmd.Stdin = strings.NewReader(send)
	out, _ := cmd.Output()
	return string(out)
}

// httpV2 sends a protocol v2 request over smart HTTP and returns the body.
func httpV2(t *testing.T, method, url, body string) string {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Git-Protocol", "version=2")
	if method == "POST" {
		req.Header.Set("Content-Type", "application/x-git-upload-pack-request")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestObjectInfoServedWhenOn: with --object-info, object-info is
// advertised and answered as git does (any object's size by id).
func TestObjectInfoServedWhenOn(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.ObjectInfo = true })
	bare := s.seed(t, "team/app")
	blob := s.env.RevParse(bare, "HEAD:"+strings.Fields(s.env.Git(bare, "ls-tree", "--name-only", "HEAD"))[0])
	if adv := httpV2(t, "GET", s.httpURL("team/app")+"/info/refs?service=git-upload-pack", ""); !strings.Contains(adv, "object-info") {
		t.Fatalf("advertisement without object-info:\n%q", adv)
	}
	info := string(mustPkt("command=object-info\n")) + "0001" + string(mustPkt("size\n")) + string(mustPkt("oid "+blob+"\n")) + "0000"
	size := strings.TrimSpace(s.env.Git(bare, "cat-file", "-s", blob))
	if out := httpV2(t, "POST", s.httpURL("team/app")+"/git-upload-pack", info); !strings.Contains(out, blob+" "+size) {
		t.Fatalf("object-info answered:\n%q", out)
	}
}
