package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/pktline"
	"packwire/internal/repo"
	"packwire/internal/server"
	"packwire/internal/servertest"
	"packwire/internal/store"
)

// startLifecycleServer starts a packwire in this process; the tests run the
// admin commands as the packwire binary, another process, on its data.
func startLifecycleServer(t *testing.T, mutate func(*server.Config)) (*servertest.Server, string, string) {
	t.Helper()
	s := servertest.Start(t, mutate)
	token := s.Token(t, "alice", "write")
	s.Repo(t, "team/app", gittest.Shape{Commits: 20, Files: 10, Branches: 2, Tags: 2, Seed: 3})
	return s, s.Data.Dir, token
}

func authURL(s *servertest.Server, token, name string) string {
	return fmt.Sprintf("http://alice:%s@%s/%s", token, s.HTTPAddr, name)
}

// cloneFails clones url and fails the test unless git says the repository
// is not found.
func cloneFails(t *testing.T, env *gittest.Env, url, name string) {
	t.Helper()
	out, err := env.Run(t.TempDir(), nil, "clone", "-q", url, "c")
	if err == nil || !strings.Contains(out, fmt.Sprintf("repository '%s' not found", name)) {
		t.Fatalf("clone %s: %v, want \"repository '%s' not found\":\n%s", url, err, name, out)
	}
}

// showRef is a repository's refs as git show-ref prints them.
func showRef(t *testing.T, env *gittest.Env, dir string) string {
	t.Helper()
	out, _ := env.Run(dir, nil, "show-ref", "--head")
	return out
}

// TestRepoDeleteRestore: a deleted repository is "not found" over HTTP and
// git://, missing from repo list and listed by repo trash; restore brings
// back the chosen version with its refs intact, and refuses while the name
// is taken.
func TestRepoDeleteRestore(t *testing.T) {
	s, data, _ := startLifecycleServer(t, nil)
	env := s.Env
	bare := s.Data.Repos.PathFor("team/app")
	before := showRef(t, env, bare)

	out, code := packwire(t, "repo", "delete", "team/app", "--data", data)
	if code != 0 || !strings.Contains(out, "deleted team/app: in the trash as ") {
		t.Fatalf("repo delete: %d\n%s", code, out)
	}
	cloneFails(t, env, s.HTTPURL("team/app"), "team/app")
	cloneFails(t, env, s.GitURL("team/app"), "team/app")
	if out, _ := packwire(t, "repo", "list", "--data", data); strings.Contains(out, "team/app") {
		t.Fatalf("repo list shows a deleted repository:\n%s", out)
	}
	out, code = packwire(t, "repo", "trash", "--data", data)
	if code != 0 || !strings.HasPrefix(out, "team/app\t") {
		t.Fatalf("repo trash: %d\n%s", code, out)
	}
	first := strings.Fields(out)[1]

	// A second repository of the name, deleted too: two versions.
	if out, code := packwire(t, "repo", "create", "team/app", "--data", data); code != 0 {
		t.Fatal(out)
	}
	if out, code := packwire(t, "repo", "restore", "team/app", "--data", data); code == 0 || !strings.Contains(out, "already exists") {
		t.Fatalf("restore over an existing repository: %d\n%s", code, out)
	}
	if out, code := packwire(t, "repo", "delete", "team/app", "--data", data); code != 0 {
		t.Fatal(out)
	}
	if list, _ := s.Data.Repos.ListTrash(); len(list) != 2 {
		t.Fatalf("trash: %+v", list)
	}
	out, code = packwire(t, "repo", "restore", "team/app", "--at", first, "--data", data)
	if code != 0 || !strings.Contains(out, "restored team/app (deleted "+first+")") {
		t.Fatalf("repo restore --at %s: %d\n%s", first, code, out)
	}
	if after := showRef(t, env, bare); after != before {
		t.Fatalf("refs after restore:\n%s\nbefore:\n%s", after, before)
	}
	env.Fsck(bare)
	for _, url := range []string{s.HTTPURL("team/app"), s.GitURL("team/app")} {
		c := filepath.Join(t.TempDir(), "c")
		env.Git("", "clone", "-q", "--mirror", url, c)
		if got := showRef(t, env, c); got != before {
			t.Fatalf("clone of the restored repository over %s:\n%s\nwant:\n%s", url, got, before)
		}
		env.Fsck(c)
	}
	// The other version stays in the trash.
	if list, _ := s.Data.Repos.ListTrash(); len(list) != 1 || list[0].Stamp() == first {
		t.Fatalf("trash after restore: %+v", list)
	}
}

// TestRepoRename: clients find the repository under its new name only, and
// the command lists the access patterns the rename took it out of (and
// into).
func TestRepoRename(t *testing.T) {
	s, data, token := startLifecycleServer(t, nil)
	env := s.Env
	ctx := context.Background()
	st := s.Data.Store
	for _, u := range []string{"bob", "carol"} {
		if _, err := st.AddUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	st.SetGrant(ctx, store.Grant{User: "bob", RepoPattern: "team/app", Role: "read"})
	st.SetGrant(ctx, store.Grant{User: "carol", RepoPattern: "archive/*", Role: "read"})
	st.SetAnonRead(ctx, store.AnonRead{RepoPattern: "team/**", Enabled: true})
	st.InsertRules(ctx, 0, store.Rule{Allow: false, Ops: "delete", RepoPattern: "team/*", RefPattern: "refs/heads/main", Who: "*"})
	before := showRef(t, env, s.Data.Repos.PathFor("team/app"))

	out, code := packwire(t, "repo", "rename", "team/app", "archive/app", "--data", data)
	want := `renamed team/app to archive/app
matched team/app, do not match archive/app:
  grant bob read 'team/app'
  rule #1 deny delete team/* refs/heads/main *
  anonymous-read on 'team/**'
match archive/app, did not match team/app:
  grant carol read 'archive/*'
`
	if code != 0 || out != want {
		t.Fatalf("repo rename: %d\n%s\nwant:\n%s", code, out, want)
	}
	cloneFails(t, env, s.GitURL("team/app"), "team/app")
	cloneFails(t, env, s.HTTPURL("team/app"), "team/app")
	c := filepath.Join(t.TempDir(), "c")
	env.Git("", "clone", "-q", "--mirror", authURL(s, token, "archive/app"), c)
	if got := showRef(t, env, c); got != before {
		t.Fatalf("clone by the new name:\n%s\nwant:\n%s", got, before)
	}
	for _, bad := range [][]string{{"archive/app", "archive/app"}, {"archive/app", "../x"}, {"nothing/here", "x"}, {"archive/app", "archive/app/inner"}} {
		if out, code := packwire(t, "repo", "rename", bad[0], bad[1], "--data", data); code == 0 {
			t.Errorf("repo rename %s %s accepted:\n%s", bad[0], bad[1], out)
		}
	}
}

// heldPush is a push over raw smart HTTP that sends its body when told.
type heldPush struct {
	conn net.Conn
	body []byte // commands, then the pack
	sent int
}

// openPush prepares a push of a new 2 MiB commit on main to name and sends
// the request's head, no body yet.
func openPush(t *testing.T, s *servertest.Server, token, name string) *heldPush {
	t.Helper()
	env := s.Env
	w := filepath.Join(t.TempDir(), "w")
	env.Git("", "clone", "-q", authURL(s, token, name), w)
	blob := make([]byte, 2<<20)
	for i := range blob { // incompressible enough that the pack stays big
		blob[i] = byte(i*7919 + i>>9*31 + i>>3)
	}
	os.WriteFile(filepath.Join(w, "big.bin"), blob, 0o644)
	env.Git(w, "add", "big.bin")
	env.Git(w, "commit", "-qm", "big")
	old, head := env.RevParse(w, "HEAD^"), env.RevParse(w, "HEAD")
	cmd := exec.Command("git", "pack-objects", "--stdout", "--revs", "-q")
	cmd.Dir, cmd.Env = w, env.Vars
	cmd.Stdin = strings.NewReader(head + "\n^" + old + "\n")
	pack, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	body, _ := pktline.Append(nil, []byte(old+" "+head+" refs/heads/main\x00report-status\n"))
	body = append(append(body, "0000"...), pack...)

	conn, err := net.Dial("tcp", s.HTTPAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	auth := base64.StdEncoding.EncodeToString([]byte("alice:" + token))
	fmt.Fprintf(conn, "POST /%s/git-receive-pack HTTP/1.1\r\nHost: %s\r\nAuthorization: Basic %s\r\n"+
		"Content-Type: application/x-git-receive-pack-request\r\nAccept: application/x-git-receive-pack-result\r\nTransfer-Encoding: chunked\r\n\r\n",
		name, s.HTTPAddr, auth)
	return &heldPush{conn: conn, body: body}
}

// send sends the body up to end (a chunk).
func (p *heldPush) send(end int) {
	fmt.Fprintf(p.conn, "%x\r\n%s\r\n", end-p.sent, p.body[p.sent:end])
	p.sent = end
}

// holdPush starts a push to name that sent its commands and half its pack,
// and returns once receive-pack is writing the pack into a quarantine.
func holdPush(t *testing.T, s *servertest.Server, token, name string) *heldPush {
	t.Helper()
	p := openPush(t, s, token, name)
	p.send(len(p.body) / 2)
	r, err := s.Data.Repos.Resolve(name)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if qs, _ := filepath.Glob(filepath.Join(r.Path, "objects", "tmp_objdir-incoming-*")); len(qs) > 0 {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatal("no push quarantine after 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// finish sends the rest of the body and returns the response.
func (p *heldPush) finish(t *testing.T) (int, string) {
	t.Helper()
	if p.sent < len(p.body) {
		p.send(len(p.body))
	}
	io.WriteString(p.conn, "0\r\n\r\n")
	p.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(p.conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestDeleteRenameRefusedDuringPush: while a push to the repository runs
// in the server, repo delete and repo rename (another process) are refused
// and change nothing; once it has ended they go through.
func TestDeleteRenameRefusedDuringPush(t *testing.T) {
	s, data, token := startLifecycleServer(t, nil)
	push := holdPush(t, s, token, "team/app")
	for _, args := range [][]string{{"repo", "delete", "team/app"}, {"repo", "rename", "team/app", "team/other"}} {
		out, code := packwire(t, append(args, "--data", data)...)
		if code != 1 || !strings.Contains(out, "team/app is in use: a push, maintenance or backup is running in it") {
			t.Fatalf("%s during a push: %d\n%s", args[1], code, out)
		}
	}
	if _, err := s.Data.Repos.Resolve("team/app"); err != nil {
		t.Fatalf("the refused commands moved the repository: %v", err)
	}
	if status, report := push.finish(t); status != 200 || !strings.Contains(report, "unpack ok") || !strings.Contains(report, "ok refs/heads/main") {
		t.Fatalf("the held push failed: %d\n%q", status, report)
	}
	s.Env.Fsck(s.Data.Repos.PathFor("team/app"))
	if out, code := packwire(t, "repo", "rename", "team/app", "team/other", "--data", data); code != 0 {
		t.Fatalf("rename after the push: %d\n%s", code, out)
	}
	if out, code := packwire(t, "repo", "delete", "team/other", "--data", data); code != 0 {
		t.Fatalf("delete after the push: %d\n%s", code, out)
	}
}

// TestPushRacingDelete: a push whose repository was deleted after the
// push had found it, before its commands arrived, is answered "not found"
// and writes nothing, in the trash or elsewhere.
func TestPushRacingDelete(t *testing.T) {
	s, data, token := startLifecycleServer(t, nil)
	push := openPush(t, s, token, "team/app")
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Pipeline.Active()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the push never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out, code := packwire(t, "repo", "delete", "team/app", "--data", data); code != 0 {
		t.Fatal(out)
	}
	status, body := push.finish(t)
	if status != 404 || body != "repository 'team/app' not found\n" {
		t.Fatalf("push into a deleted repository: %d %q", status, body)
	}
	list, _ := s.Data.Repos.ListTrash()
	if len(list) != 1 {
		t.Fatalf("trash: %+v", list)
	}
	if qs, _ := filepath.Glob(filepath.Join(list[0].Path, "objects", "tmp_objdir-*")); len(qs) > 0 {
		t.Fatalf("the push wrote into the trash: %v", qs)
	}
	s.Env.Fsck(list[0].Path)
}

// TestTrashExpiry: the server's maintenance scheduler removes deleted
// repositories older than --trash-retention and keeps the others.
func TestTrashExpiry(t *testing.T) {
	s, data, _ := startLifecycleServer(t, func(c *server.Config) {
		c.MaintainInterval = 50 * time.Millisecond
		c.TrashRetention = time.Hour
	})
	s.Repo(t, "team/lib", gittest.Shape{Commits: 2})
	for _, name := range []string{"team/app", "team/lib"} {
		// The scheduler maintains these new repositories meanwhile, which
		// refuses a delete: retry as an admin would.
		for start := time.Now(); ; {
			out, code := packwire(t, "repo", "delete", name, "--data", data)
			if code == 0 {
				break
			}
			if !strings.Contains(out, "is in use") || time.Since(start) > 20*time.Second {
				t.Fatal(out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	list, err := s.Data.Repos.ListTrash()
	if err != nil || len(list) != 2 {
		t.Fatalf("trash: %+v %v", list, err)
	}
	// team/app was deleted two hours ago, as far as its name says.
	old := strings.Replace(list[0].Path, list[0].Stamp(), list[0].Deleted.Add(-2*time.Hour).Format(repo.TrashStamp), 1)
	if err := os.Rename(list[0].Path, old); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(old); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("expired trash still there after 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if list, _ := s.Data.Repos.ListTrash(); len(list) != 1 || list[0].Name != "team/lib" {
		t.Fatalf("trash after expiry: %+v", list)
	}
}

// makeData makes an empty data directory, as packwire serve does on its
// first start, for admin commands (which do not create one).
func makeData(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(filepath.Join(dir, "repos"), 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), filepath.Join(dir, "packwire.db"))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	return dir
}

// TestMaintainExpiresTrash: packwire maintain removes expired trash too
// (--dry-run only names it), for servers run without the scheduler.
func TestMaintainExpiresTrash(t *testing.T) {
	data := makeData(t)
	for _, args := range [][]string{{"repo", "create", "app"}, {"repo", "delete", "app"}, {"repo", "create", "app"}, {"repo", "delete", "app"}} {
		if out, code := packwire(t, append(args, "--data", data)...); code != 0 {
			t.Fatal(out)
		}
	}
	root := repo.Root{Dir: filepath.Join(data, "repos")}
	list, _ := root.ListTrash()
	if len(list) != 2 {
		t.Fatalf("trash: %+v", list)
	}
	oldStamp, kept := list[0].Deleted.Add(-30*time.Hour).Format(repo.TrashStamp), list[1].Stamp()
	os.Rename(list[0].Path, strings.Replace(list[0].Path, list[0].Stamp(), oldStamp, 1))
	out, code := packwire(t, "maintain", "--dry-run", "--trash-retention", "24h", "--data", data)
	if code != 0 || !strings.Contains(out, "app: would remove deleted version "+oldStamp) || strings.Contains(out, kept) {
		t.Fatalf("maintain --dry-run: %d\n%s", code, out)
	}
	out, code = packwire(t, "maintain", "--trash-retention", "24h", "--data", data)
	if code != 0 || !strings.Contains(out, "app: removed deleted version "+oldStamp+" from the trash") {
		t.Fatalf("maintain: %d\n%s", code, out)
	}
	if list, _ := root.ListTrash(); len(list) != 1 || list[0].Stamp() != kept {
		t.Fatalf("trash after maintain: %+v", list)
	}
}

// TestLifecycleHelp: every new command explains itself and creates nothing.
func TestLifecycleHelp(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{"repo", "delete"}, {"repo", "restore"}, {"repo", "trash"}, {"repo", "rename"},
		{"repo", "set-description"}, {"backup"}, {"restore"}} {
		cmd := exec.Command(binary, append(args, "--help")...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "usage: packwire "+strings.Join(args, " ")) {
			t.Errorf("%s --help: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("--help created %v", entries)
	}
}
