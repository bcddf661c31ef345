package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/access"
	"packwire/internal/gittest"
	"packwire/internal/governor"
	"packwire/internal/lfs"
	"packwire/internal/pktline"
	"packwire/internal/repo"
)

// requireGitLFS fails (not skips) without git-lfs: the end-to-end tests
// would prove nothing.
func requireGitLFS(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("git-lfs"); err != nil {
		t.Fatal("git-lfs is not installed: run scripts/install-deps (apt-get install -y git-lfs)")
	}
}

// lfsServer is an access server with git-lfs set up in the client's HOME.
func startLFSServer(t *testing.T) *accessServer {
	t.Helper()
	requireGitLFS(t)
	a := startAccessServer(t)
	a.env.Git("", "lfs", "install", "--skip-repo")
	return a
}

// randomBytes is n bytes no compression shrinks, from seed.
func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// lfsWork makes a working repository that tracks *.bin with LFS, holding
// one committed file of content, and returns it.
func (a *accessServer) lfsWork(t *testing.T, content []byte) string {
	t.Helper()
	w := filepath.Join(t.TempDir(), "w")
	a.env.Git("", "init", "-q", w)
	a.env.Git(w, "lfs", "install", "--local")
	a.env.Git(w, "lfs", "track", "*.bin")
	os.WriteFile(filepath.Join(w, "a.bin"), content, 0o644)
	os.WriteFile(filepath.Join(w, "README"), []byte("lfs test\n"), 0o644)
	a.env.Git(w, "add", ".")
	a.env.Git(w, "commit", "-qm", "first")
	return w
}

// lfsObjectFiles lists what the LFS store holds on disk: objects and
// temporary files (an upload that failed leaves none).
func (a *accessServer) lfsObjectFiles(t *testing.T) (objects, temps []string) {
	t.Helper()
	dir := filepath.Join(a.Data.Dir, "lfs")
	filepath.WalkDir(filepath.Join(dir, "objects"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			objects = append(objects, filepath.Base(p))
		}
		return nil
	})
	ents, _ := os.ReadDir(filepath.Join(dir, "tmp"))
	for _, e := range ents {
		temps = append(temps, e.Name())
	}
	return objects, temps
}

func TestLFSOverHTTP(t *testing.T) {
	t.Parallel()
	a := startLFSServer(t)
	a.grant(t, "alice", "write", "**")
	if _, err := a.Data.Repos.Create(context.Background(), "lfs/app"); err != nil {
		t.Fatal(err)
	}
	content := randomBytes(1, 200<<10)
	w := a.lfsWork(t, content)

	// git lfs's pre-push hook uploads the object, then git pushes the refs
	// (which the push check lets through: the object is there).
	if out, err := a.git(t, w, "http", a.alice, "lfs/app", "push", "URL", "HEAD:refs/heads/main"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	objects, temps := a.lfsObjectFiles(t)
	if len(objects) != 1 || objects[0] != sha256Hex(content) || len(temps) != 0 {
		t.Fatalf("store holds %v (temp %v), want the one object %s", objects, temps, sha256Hex(content))
	}

	// A clone smudges the file from the server.
	c := filepath.Join(t.TempDir(), "c")
	if out, err := a.git(t, "", "http", a.alice, "lfs/app", "clone", "-q", "URL", c); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(c, "a.bin")); !bytes.Equal(got, content) {
		t.Fatalf("cloned a.bin is %d bytes, not the pushed content", len(got))
	}

	// Without smudging, then git lfs pull and fetch --all.
	s := filepath.Join(t.TempDir(), "s")
	url, _ := a.remote("http", a.alice, "lfs/app")
	if out, err := a.env.Run("", []string{"GIT_LFS_SKIP_SMUDGE=1"}, "clone", "-q", url, s); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(s, "a.bin")); bytes.Equal(got, content) || !bytes.HasPrefix(got, []byte("version https://git-lfs")) {
		t.Fatalf("a clone with GIT_LFS_SKIP_SMUDGE has %q, want the pointer", got[:min(40, len(got))])
	}
	a.env.Git(s, "lfs", "pull")
	if got, _ := os.ReadFile(filepath.Join(s, "a.bin")); !bytes.Equal(got, content) {
		t.Fatal("git lfs pull did not bring the content")
	}
	a.env.Git(s, "lfs", "fetch", "--all")

	// git lfs migrate import of an existing history, then push.
	m := filepath.Join(t.TempDir(), "m")
	a.env.Git("", "init", "-q", m)
	big := randomBytes(2, 50<<10)
	os.WriteFile(filepath.Join(m, "data.dat"), big, 0o644)
	a.env.Git(m, "add", ".")
	a.env.Git(m, "commit", "-qm", "plain file")
	a.env.Git(m, "lfs", "migrate", "import", "--include=*.dat", "--everything")
	if out, err := a.git(t, m, "http", a.alice, "lfs/app", "push", "URL", "HEAD:refs/heads/migrated"); err != nil {
		t.Fatalf("push after migrate: %v\n%s", err, out)
	}
	if _, ok := a.LFS.Objects.Stat(sha256Hex(big)); !ok {
		t.Fatal("the migrated file's object is not on the server")
	}
}

// TestLFSPullReusesConnection: git lfs pull, one transfer at a time, asks
// the batch and downloads every object over one kept-alive connection.
// The batch answer for 100 objects (git-lfs's batch size) is ~30 KiB:
// sent chunked, git-lfs's decoder stopped before the last chunk and the
// client closed the connection, a new one for the downloads (issue 31's
// extra connection per pull).
func TestLFSPullReusesConnection(t *testing.T) {
	t.Parallel()
	a := startLFSServer(t)
	a.grant(t, "alice", "write", "**")
	if _, err := a.Data.Repos.Create(context.Background(), "lfs/keep"); err != nil {
		t.Fatal(err)
	}
	// The objects go into the store directly (100 uploads by git-lfs would
	// take seconds), the pointers by a push without git-lfs's pre-push.
	w := a.lfsWork(t, randomBytes(1, 100))
	for i := range 99 {
		os.WriteFile(filepath.Join(w, fmt.Sprintf("b%02d.bin", i)), randomBytes(uint64(i+2), 100), 0o644)
	}
	a.env.Git(w, "add", ".")
	a.env.Git(w, "commit", "-qm", "more objects")
	for i := range 100 {
		content := randomBytes(uint64(i+1), 100)
		oid := sha256Hex(content)
		if _, err := a.LFS.Objects.Put(oid, 100, bytes.NewReader(content)); err != nil {
			t.Fatal(err)
		}
		if err := a.LFS.Index.Add(context.Background(), "lfs/keep", oid, 100); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := a.git(t, w, "http", a.alice, "lfs/keep", "push", "--no-verify", "URL", "HEAD:refs/heads/main"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	c := filepath.Join(t.TempDir(), "c")
	url, _ := a.remote("http", a.alice, "lfs/keep")
	if out, err := a.env.Run("", []string{"GIT_LFS_SKIP_SMUDGE=1"}, "clone", "-q", url, c); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	proxy := gittest.NewSlowProxy(t, a.HTTPAddr.String(), 1)
	proxy.Release()
	lfsURL := fmt.Sprintf("http://alice:%s@%s/lfs/keep.git/info/lfs", a.alice.token, proxy.Addr)
	a.env.Git(c, "-c", "lfs.url="+lfsURL, "-c", "lfs.concurrenttransfers=1", "lfs", "pull")
	if got, _ := os.ReadFile(filepath.Join(c, "b98.bin")); !bytes.Equal(got, randomBytes(100, 100)) {
		t.Fatal("git lfs pull did not bring b98.bin's content")
	}
	if n := proxy.Accepted(); n != 1 {
		t.Fatalf("git lfs pull of 100 objects opened %d connections, want 1 (the batch's kept alive for the downloads)", n)
	}
}

// TestLFSPushNeedsObjects: a push whose new commits add an LFS pointer to
// an object the server does not hold is refused, naming it (the pre-push
// hook skipped: git push --no-verify).
func TestLFSPushNeedsObjects(t *testing.T) {
	t.Parallel()
	a := startLFSServer(t)
	a.grant(t, "alice", "write", "**")
	if _, err := a.Data.Repos.Create(context.Background(), "lfs/app"); err != nil {
		t.Fatal(err)
	}
	content := randomBytes(3, 10<<10)
	w := a.lfsWork(t, content)
	for _, transport := range []string{"http", "ssh"} {
		out, err := a.git(t, w, transport, a.alice, "lfs/app", "push", "--no-verify", "URL", "HEAD:refs/heads/main")
		if err == nil || !strings.Contains(out, sha256Hex(content)) || !strings.Contains(out, "does not have") {
			t.Fatalf("%s: push of a pointer without its object: %v\n%s", transport, err, out)
		}
		if ref := refOf(a, a.Data.Repos.PathFor("lfs/app"), "refs/heads/main"); ref != "" {
			t.Fatalf("%s: main moved to %s", transport, ref)
		}
	}
	// With the object uploaded first (git lfs push), the same push passes.
	if out, err := a.git(t, w, "http", a.alice, "lfs/app", "lfs", "push", "--all", "URL"); err != nil {
		t.Fatalf("git lfs push: %v\n%s", err, out)
	}
	if out, err := a.git(t, w, "http", a.alice, "lfs/app", "push", "--no-verify", "URL", "HEAD:refs/heads/main"); err != nil {
		t.Fatalf("push after git lfs push: %v\n%s", err, out)
	}
}

// TestLFSOverSSH: git-lfs 3 over SSH alone (git-lfs-transfer: the
// transfers are SSH records; locks too), and git-lfs-authenticate, whose
// href and header reach the object over HTTP.
func TestLFSOverSSH(t *testing.T) {
	t.Parallel()
	a := startLFSServer(t)
	a.grant(t, "alice", "write", "**")
	name := "lfs/app"
	if _, err := a.Data.Repos.Create(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	seq := a.lastSeq(t)
	content := randomBytes(10, 100<<10)
	w := a.lfsWork(t, content)
	if out, err := a.git(t, w, "ssh", a.alice, name, "push", "URL", "HEAD:refs/heads/main"); err != nil {
		t.Fatalf("push over SSH: %v\n%s", err, out)
	}
	c := filepath.Join(t.TempDir(), "c")
	if out, err := a.git(t, "", "ssh", a.alice, name, "clone", "-q", "URL", c); err != nil {
		t.Fatalf("clone over SSH: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(c, "a.bin")); !bytes.Equal(got, content) {
		t.Fatalf("a.bin cloned over SSH is %d bytes, not the pushed content", len(got))
	}
	recs := a.recordsAfter(t, seq, func(rs []governor.Record) bool {
		kinds := map[string]bool{}
		for _, r := range rs {
			kinds[r.Kind] = true
		}
		return kinds["lfs-upload"] && kinds["lfs-download"]
	})
	for _, r := range recs {
		if strings.HasPrefix(r.Kind, "lfs-") && (r.Transport != "ssh" || r.Result != "ok" || r.User != "alice") {
			t.Fatalf("record %+v, want an SSH transfer by alice", r)
		}
	}
	sshEnv := a.sshEnv(a.alice)
	if out, err := a.env.Run(c, sshEnv, "lfs", "lock", "a.bin"); err != nil || !strings.Contains(out, "Locked a.bin") {
		t.Fatalf("lock over SSH: %v\n%s", err, out)
	}
	if out, err := a.env.Run(c, sshEnv, "lfs", "locks"); err != nil || !strings.Contains(out, "a.bin") || !strings.Contains(out, "alice") {
		t.Fatalf("locks over SSH: %v\n%s", err, out)
	}
	if out, err := a.env.Run(c, sshEnv, "lfs", "unlock", "a.bin"); err != nil {
		t.Fatalf("unlock over SSH: %v\n%s", err, out)
	}

	// git-lfs-authenticate: an href and a header good for the HTTP API.
	_, port, _ := strings.Cut(a.SSHAddr.String(), ":")
	args := append(gittest.SSHOptions(a.alice.key, "", "-p", port), "git@127.0.0.1", "git-lfs-authenticate '"+name+".git' download")
	out, err := exec.Command("ssh", args...).Output()
	if err != nil {
		t.Fatalf("git-lfs-authenticate: %v\n%s", err, out)
	}
	var auth struct {
		Href      string
		Header    map[string]string
		ExpiresIn int `json:"expires_in"`
	}
	if err := json.Unmarshal(out, &auth); err != nil || auth.ExpiresIn <= 0 || auth.Header["Authorization"] == "" {
		t.Fatalf("git-lfs-authenticate answered %q (%v)", out, err)
	}
	req, _ := http.NewRequest("GET", auth.Href+"/objects/"+sha256Hex(content), nil)
	req.Header.Set("Authorization", auth.Header["Authorization"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, content) {
		t.Fatalf("download with git-lfs-authenticate's answer: %d, %d bytes", resp.StatusCode, len(got))
	}
	// An unregistered key is anonymous: no header, and no upload.
	args = append(gittest.SSHOptions(a.env.NewSSHKey("stranger"), "", "-p", port), "git@127.0.0.1", "git-lfs-authenticate "+name+" upload")
	if out, err := exec.Command("ssh", args...).CombinedOutput(); err == nil || !strings.Contains(string(out), "authentication required") {
		t.Fatalf("anonymous git-lfs-authenticate upload: %v\n%s", err, out)
	}
}

// sshEnv is the environment with which git reaches the server as who over SSH.
func (a *accessServer) sshEnv(who *actor) []string {
	_, env := a.remote("ssh", who, "")
	return env
}

// lfsRequest sends one LFS API request as user (token) and returns the
// status and body.
func (a *accessServer) lfsRequest(t *testing.T, who *actor, method, repo, path string, body io.Reader, contentLength int64) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, fmt.Sprintf("http://%s/%s.git/info/lfs/%s", a.HTTPAddr, repo, path), body)
	if err != nil {
		t.Fatal(err)
	}
	if contentLength >= 0 {
		req.ContentLength = contentLength
	}
	req.Header.Set("Accept", "application/vnd.git-lfs+json")
	req.Header.Set("Content-Type", "application/vnd.git-lfs+json")
	if who.name != "" {
		req.SetBasicAuth(who.name, who.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func batchBody(op, oid string, size int) string {
	return fmt.Sprintf(`{"operation":%q,"transfers":["basic"],"objects":[{"oid":%q,"size":%d}]}`, op, oid, size)
}

// TestLFSBadInput: wrong hash, wrong size, a truncated upload, an unknown
// or malformed oid, an object over the limit get LFS's errors and leave
// nothing in the store; another repository's object is not readable.
func TestLFSBadInput(t *testing.T) {
	t.Parallel()
	requireGitLFS(t)
	a := startAccessServerWith(t, func(c *Config) { c.MaxLFSObjectBytes = 1 << 20 })
	a.grant(t, "alice", "write", "**")
	bob := a.addUser(t, "bob")
	a.grant(t, "bob", "write", "lfs/b")
	ctx := context.Background()
	if err := a.Data.Store.SetSetting(ctx, access.SettingAnonRead, "off"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"lfs/a", "lfs/b"} {
		if _, err := a.Data.Repos.Create(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	content := randomBytes(5, 4096)
	oid := sha256Hex(content)
	empty := func(what string) {
		t.Helper()
		if objects, temps := a.lfsObjectFiles(t); len(objects) != 0 || len(temps) != 0 {
			t.Fatalf("%s left objects %v, temp files %v", what, objects, temps)
		}
	}

	// Wrong content for the oid: 422, nothing kept.
	wrong := randomBytes(6, 4096)
	if status, body, _ := a.lfsRequest(t, a.alice, "PUT", "lfs/a", "objects/"+oid, bytes.NewReader(wrong), int64(len(wrong))); status != 422 || !strings.Contains(body, "hash mismatch") {
		t.Fatalf("wrong hash: %d %s", status, body)
	}
	empty("a wrong hash")
	// Over the limit: 413 in the batch and on PUT.
	if status, body, _ := a.lfsRequest(t, a.alice, "POST", "lfs/a", "objects/batch", strings.NewReader(batchBody("upload", oid, 2<<20)), -1); status != 200 || !strings.Contains(body, `"code":413`) {
		t.Fatalf("batch over the limit: %d %s", status, body)
	}
	// A truncated upload: the client announces more than it sends, then hangs up.
	conn, err := net.Dial("tcp", a.HTTPAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT /lfs/a.git/info/lfs/objects/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Basic %s\r\nContent-Length: %d\r\n\r\n", oid, basicAuth("alice", a.alice.token), len(content))
	conn.Write(content[:1000])
	conn.Close()
	// The server's answer to the next request comes after it saw the
	// hang-up (one connection's handler ends before the next is counted).
	waitFor(t, time.Minute, "the truncated upload to be dropped", func() bool {
		objects, temps := a.lfsObjectFiles(t)
		return len(objects) == 0 && len(temps) == 0
	})
	// Unknown and malformed oids.
	if status, body, _ := a.lfsRequest(t, a.alice, "GET", "lfs/a", "objects/"+oid, nil, -1); status != 404 || !strings.Contains(body, "Object does not exist") {
		t.Fatalf("unknown oid: %d %s", status, body)
	}
	if status, _, _ := a.lfsRequest(t, a.alice, "GET", "lfs/a", "objects/"+strings.ToUpper(oid), nil, -1); status != 422 {
		t.Fatalf("upper-case oid: %d", status)
	}
	// The right upload through lfs/a, then verify.
	if status, body, _ := a.lfsRequest(t, a.alice, "PUT", "lfs/a", "objects/"+oid, bytes.NewReader(content), int64(len(content))); status != 200 {
		t.Fatalf("upload: %d %s", status, body)
	}
	if status, body, _ := a.lfsRequest(t, a.alice, "POST", "lfs/a", "objects/verify", strings.NewReader(fmt.Sprintf(`{"oid":%q,"size":%d}`, oid, len(content))), -1); status != 200 {
		t.Fatalf("verify: %d %s", status, body)
	}
	if status, _, _ := a.lfsRequest(t, a.alice, "POST", "lfs/a", "objects/verify", strings.NewReader(fmt.Sprintf(`{"oid":%q,"size":%d}`, oid, 1)), -1); status != 422 {
		t.Fatalf("verify of the wrong size: %d", status)
	}
	// bob may not read lfs/a (404, as for a missing repository), and lfs/b
	// does not hold the object though the store does.
	if status, _, _ := a.lfsRequest(t, bob, "GET", "lfs/a", "objects/"+oid, nil, -1); status != 404 {
		t.Fatalf("bob reading lfs/a: %d", status)
	}
	if status, body, _ := a.lfsRequest(t, bob, "POST", "lfs/b", "objects/batch", strings.NewReader(batchBody("download", oid, len(content))), -1); status != 200 || !strings.Contains(body, `"code":404`) {
		t.Fatalf("bob's batch through lfs/b for lfs/a's object: %d %s", status, body)
	}
	if status, _, _ := a.lfsRequest(t, bob, "GET", "lfs/b", "objects/"+oid, nil, -1); status != 404 {
		t.Fatalf("bob's download through lfs/b: %d", status)
	}
	// Anonymous: 401 with LFS-Authenticate (anonymous read is off here).
	if status, _, h := a.lfsRequest(t, anon, "POST", "lfs/a", "objects/batch", strings.NewReader(batchBody("download", oid, len(content))), -1); status != 401 || h.Get("LFS-Authenticate") == "" {
		t.Fatalf("anonymous batch: %d, LFS-Authenticate %q", status, h.Get("LFS-Authenticate"))
	}
	// Range: a resumed download gets the rest.
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://%s/lfs/a.git/info/lfs/objects/%s", a.HTTPAddr, oid), nil)
	req.SetBasicAuth("alice", a.alice.token)
	req.Header.Set("Range", "bytes=1000-")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 206 || !bytes.Equal(rest, content[1000:]) {
		t.Fatalf("range download: %d, %d bytes", resp.StatusCode, len(rest))
	}
}

// TestLFSLocks: git lfs lock, locks, unlock; another user's lock is
// refused without force, and force needs the admin role.
func TestLFSLocks(t *testing.T) {
	t.Parallel()
	a := startLFSServer(t)
	a.grant(t, "alice", "write", "**")
	bob := a.addUser(t, "bob")
	a.grant(t, "bob", "write", "**")
	if _, err := a.Data.Repos.Create(context.Background(), "lfs/app"); err != nil {
		t.Fatal(err)
	}
	w := a.lfsWork(t, randomBytes(7, 1000))
	if out, err := a.git(t, w, "http", a.alice, "lfs/app", "push", "URL", "HEAD:refs/heads/main"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	clone := func(who *actor) string {
		c := filepath.Join(t.TempDir(), "c")
		if out, err := a.git(t, "", "http", who, "lfs/app", "clone", "-q", "URL", c); err != nil {
			t.Fatalf("clone: %v\n%s", err, out)
		}
		return c
	}
	ca, cb := clone(a.alice), clone(bob)
	if out, err := a.env.Run(ca, nil, "lfs", "lock", "a.bin"); err != nil || !strings.Contains(out, "Locked a.bin") {
		t.Fatalf("alice's lock: %v\n%s", err, out)
	}
	if out, err := a.env.Run(cb, nil, "lfs", "lock", "a.bin"); err == nil {
		t.Fatalf("bob locked a.bin that alice holds:\n%s", out)
	}
	if out := a.env.Git(cb, "lfs", "locks"); !strings.Contains(out, "a.bin") || !strings.Contains(out, "alice") {
		t.Fatalf("git lfs locks: %q", out)
	}
	out, err := a.env.Run(cb, nil, "lfs", "unlock", "--force", "a.bin")
	if err == nil || !strings.Contains(out, "owned by another user") {
		t.Fatalf("bob's forced unlock without admin: %v\n%s", err, out)
	}
	status, body, _ := a.lfsRequest(t, bob, "POST", "lfs/app", "locks/1/unlock", strings.NewReader(`{}`), -1)
	if status != 403 || !strings.Contains(body, "owned by another user") {
		t.Fatalf("bob's unlock without force: %d %s", status, body)
	}
	a.grant(t, "bob", "admin", "lfs/app")
	if out, err := a.env.Run(cb, nil, "lfs", "unlock", "--force", "a.bin"); err != nil {
		t.Fatalf("an admin's forced unlock: %v\n%s", err, out)
	}
	if out, err := a.env.Run(ca, nil, "lfs", "lock", "a.bin"); err != nil {
		t.Fatalf("lock again: %v\n%s", err, out)
	}
	if out, err := a.env.Run(ca, nil, "lfs", "unlock", "a.bin"); err != nil {
		t.Fatalf("alice's unlock: %v\n%s", err, out)
	}
	var list struct{ Locks []json.RawMessage }
	_, body, _ = a.lfsRequest(t, a.alice, "GET", "lfs/app", "locks", nil, -1)
	if json.Unmarshal([]byte(body), &list); len(list.Locks) != 0 {
		t.Fatalf("locks left: %s", body)
	}
}

// TestLFSAccounting: an upload and a download are governor records of
// their kind with their bytes, user and repository, and on /metrics; a
// repository's quota counts LFS bytes (507 past it).
func TestLFSAccounting(t *testing.T) {
	t.Parallel()
	requireGitLFS(t)
	a := startAccessServerWith(t, func(c *Config) { c.MetricsPublic = true })
	a.grant(t, "alice", "write", "**")
	ctx := context.Background()
	r, err := a.Data.Repos.Create(ctx, "lfs/q")
	if err != nil {
		t.Fatal(err)
	}
	seq := a.lastSeq(t)
	content := randomBytes(8, 20000)
	oid := sha256Hex(content)
	if status, body, _ := a.lfsRequest(t, a.alice, "PUT", "lfs/q", "objects/"+oid, bytes.NewReader(content), int64(len(content))); status != 200 {
		t.Fatalf("upload: %d %s", status, body)
	}
	if status, body, _ := a.lfsRequest(t, a.alice, "GET", "lfs/q", "objects/"+oid, nil, -1); status != 200 || body != string(content) {
		t.Fatalf("download: %d, %d bytes", status, len(body))
	}
	// Anonymous read is on here: anyone downloads, no one anonymous uploads.
	if status, body, _ := a.lfsRequest(t, anon, "GET", "lfs/q", "objects/"+oid, nil, -1); status != 200 || body != string(content) {
		t.Fatalf("anonymous download where anonymous read is on: %d", status)
	}
	if status, _, h := a.lfsRequest(t, anon, "PUT", "lfs/q", "objects/"+oid, bytes.NewReader(content), int64(len(content))); status != 401 || h.Get("LFS-Authenticate") == "" {
		t.Fatalf("anonymous upload: %d", status)
	}
	recs := a.recordsAfter(t, seq, func(rs []governor.Record) bool {
		n := 0
		for _, r := range rs {
			if r.User == "alice" {
				n++
			}
		}
		return n >= 2
	})
	kinds := map[string]governor.Record{}
	for _, rec := range recs {
		if rec.User == "alice" {
			kinds[rec.Kind] = rec
		}
	}
	if up := kinds["lfs-upload"]; up.BytesIn != int64(len(content)) || up.User != "alice" || up.Repo != "lfs/q" || up.Result != "ok" {
		t.Fatalf("upload record: %+v", up)
	}
	if down := kinds["lfs-download"]; down.BytesOut != int64(len(content)) || down.User != "alice" || down.Repo != "lfs/q" || down.Result != "ok" {
		t.Fatalf("download record: %+v", down)
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/metrics", a.HTTPAddr))
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `kind="lfs-download"`) || !strings.Contains(string(metrics), `kind="lfs-upload"`) {
		t.Fatal("/metrics has no lfs-download / lfs-upload series")
	}

	// A quota just over what the repository holds (git's objects and the
	// LFS object): another object of that size does not fit.
	used, err := repo.Usage(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.SetQuota(ctx, r, used+int64(len(content))+1000); err != nil {
		t.Fatal(err)
	}
	other := randomBytes(9, 20000)
	status, body, _ := a.lfsRequest(t, a.alice, "POST", "lfs/q", "objects/batch", strings.NewReader(batchBody("upload", sha256Hex(other), len(other))), -1)
	if status != 507 || !strings.Contains(body, "quota") {
		t.Fatalf("batch past the quota: %d %s", status, body)
	}
	if status, body, _ := a.lfsRequest(t, a.alice, "PUT", "lfs/q", "objects/"+sha256Hex(other), bytes.NewReader(other), int64(len(other))); status != 507 {
		t.Fatalf("upload past the quota: %d %s", status, body)
	}
}

// TestLFSTransferBadInput: over git-lfs-transfer, an upload whose content
// does not hash to its oid is refused with 422 and leaves nothing; the
// session goes on (verify-object then says 404) and ends with quit.
func TestLFSTransferBadInput(t *testing.T) {
	t.Parallel()
	requireGitLFS(t)
	a := startAccessServer(t)
	a.grant(t, "alice", "write", "**")
	if _, err := a.Data.Repos.Create(context.Background(), "lfs/a"); err != nil {
		t.Fatal(err)
	}
	_, stdin, stdout, done := a.sshSession(t, a.alice, "git-lfs-transfer lfs/a upload")
	defer done()
	in := pktline.NewReader(stdout)
	// readUntilFlush returns the text packets of one answer (a delim as "DELIM").
	readUntilFlush := func() []string {
		t.Helper()
		var got []string
		for {
			kind, line, err := in.Read()
			if err != nil {
				t.Fatalf("reading: %v (so far %q)", err, got)
			}
			switch kind {
			case pktline.Flush:
				return got
			case pktline.Delim:
				got = append(got, "DELIM")
			default:
				got = append(got, strings.TrimSuffix(string(line), "\n"))
			}
		}
	}
	if caps := readUntilFlush(); len(caps) == 0 || caps[0] != "version=1" {
		t.Fatalf("capabilities: %q", caps)
	}
	stdin.Write(pkts("version 1", ""))
	if got := readUntilFlush(); len(got) != 1 || got[0] != "status 200" {
		t.Fatalf("version: %q", got)
	}
	content := randomBytes(11, 5000)
	oid := sha256Hex(content)
	msg := pkts("put-object "+oid, fmt.Sprintf("size=%d", len(content)), "DELIM")
	msg, _ = pktline.Append(msg, randomBytes(12, 5000))
	msg = append(msg, "0000"...)
	stdin.Write(msg)
	if got := readUntilFlush(); len(got) < 3 || got[0] != "status 422" || !strings.Contains(got[2], "hash mismatch") {
		t.Fatalf("put-object of the wrong content: %q", got)
	}
	if objects, temps := a.lfsObjectFiles(t); len(objects) != 0 || len(temps) != 0 {
		t.Fatalf("left objects %v, temp files %v", objects, temps)
	}
	stdin.Write(pkts("verify-object "+oid, fmt.Sprintf("size=%d", len(content)), ""))
	if got := readUntilFlush(); len(got) == 0 || got[0] != "status 404" {
		t.Fatalf("verify-object: %q", got)
	}
	stdin.Write(pkts("quit", ""))
	if got := readUntilFlush(); len(got) != 1 || got[0] != "status 200" {
		t.Fatalf("quit: %q", got)
	}
}

// TestLFSQuotaCountsForPushes: LFS objects that fill a repository's quota
// leave no room for a git push either.
func TestLFSQuotaCountsForPushes(t *testing.T) {
	t.Parallel()
	requireGitLFS(t)
	a := startAccessServer(t)
	a.grant(t, "alice", "write", "**")
	ctx := context.Background()
	r, err := a.Data.Repos.Create(ctx, "lfs/q")
	if err != nil {
		t.Fatal(err)
	}
	a.env.Build(r.Path, gittest.Shape{Commits: 2, Files: 2, BlobBytes: 100, Seed: 1})
	content := randomBytes(13, 30000)
	if status, body, _ := a.lfsRequest(t, a.alice, "PUT", "lfs/q", "objects/"+sha256Hex(content), bytes.NewReader(content), int64(len(content))); status != 200 {
		t.Fatalf("upload: %d %s", status, body)
	}
	used, err := repo.Usage(r)
	if err != nil {
		t.Fatal(err)
	}
	// Room for git's objects, not for them and the LFS object.
	if err := repo.SetQuota(ctx, r, used+int64(len(content))/2); err != nil {
		t.Fatal(err)
	}
	w := a.work(t, r.Path)
	a.commit(w, "one more")
	out, err := a.git(t, w, "http", a.alice, "lfs/q", "push", "URL", "HEAD:refs/heads/main")
	if err == nil || !strings.Contains(out, "over its quota") {
		t.Fatalf("push into a repository whose LFS objects fill its quota: %v\n%s", err, out)
	}
}

// TestLFSForceUnlockOverSSH: over git-lfs-transfer, another user's lock is
// refused to a writer with LFS's wording and removed by an admin's
// `git lfs unlock --force`.
func TestLFSForceUnlockOverSSH(t *testing.T) {
	t.Parallel()
	a := startLFSServer(t)
	a.grant(t, "alice", "write", "**")
	bob := a.addUser(t, "bob")
	a.grant(t, "bob", "write", "**")
	if _, err := a.Data.Repos.Create(context.Background(), "lfs/app"); err != nil {
		t.Fatal(err)
	}
	w := a.lfsWork(t, randomBytes(8, 1000))
	if out, err := a.git(t, w, "ssh", a.alice, "lfs/app", "push", "URL", "HEAD:refs/heads/main"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	clone := func(who *actor) string {
		c := filepath.Join(t.TempDir(), "c")
		if out, err := a.git(t, "", "ssh", who, "lfs/app", "clone", "-q", "URL", c); err != nil {
			t.Fatalf("clone: %v\n%s", err, out)
		}
		return c
	}
	ca, cb := clone(a.alice), clone(bob)
	if out, err := a.env.Run(ca, a.sshEnv(a.alice), "lfs", "lock", "a.bin"); err != nil || !strings.Contains(out, "Locked a.bin") {
		t.Fatalf("alice's lock: %v\n%s", err, out)
	}
	out, err := a.env.Run(cb, a.sshEnv(bob), "lfs", "unlock", "--force", "a.bin")
	if err == nil || !strings.Contains(out, "owned by another user") {
		t.Fatalf("bob's forced unlock without admin: %v\n%s", err, out)
	}
	a.grant(t, "bob", "admin", "lfs/app")
	if out, err := a.env.Run(cb, a.sshEnv(bob), "lfs", "unlock", "--force", "a.bin"); err != nil {
		t.Fatalf("an admin's forced unlock over SSH: %v\n%s", err, out)
	}
	if ls, err := a.LFS.Index.Locks(context.Background(), "lfs/app", lfs.LockFilter{}); err != nil || len(ls) != 0 {
		t.Fatalf("locks left: %v, %v", ls, err)
	}
}

// TestLFSFetchFromImportSource: what repo import does after cloning an
// LFS-using source: the objects its pointers name come from the source's
// LFS API (here another packwire) into a fresh store, verified, and held
// by the imported repository; a second pass fetches nothing.
func TestLFSFetchFromImportSource(t *testing.T) {
	t.Parallel()
	a := startLFSServer(t)
	a.grant(t, "alice", "write", "**")
	if _, err := a.Data.Repos.Create(context.Background(), "lfs/app"); err != nil {
		t.Fatal(err)
	}
	content := randomBytes(11, 50<<10)
	w := a.lfsWork(t, content)
	if out, err := a.git(t, w, "http", a.alice, "lfs/app", "push", "URL", "HEAD:refs/heads/main"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	bare := filepath.Join(t.TempDir(), "copy.git")
	if out, err := a.git(t, "", "http", a.alice, "lfs/app", "clone", "--bare", "-q", "URL", bare); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	data := t.TempDir()
	source := fmt.Sprintf("http://%s/lfs/app", a.HTTPAddr)
	ctx := context.Background()
	fetched, missing, size, err := lfs.FetchObjects(ctx, data, "copy", bare, source, "alice", a.alice.token)
	if err != nil || fetched != 1 || missing != 0 || size != int64(len(content)) {
		t.Fatalf("fetch: %d fetched, %d missing, %d bytes, %v", fetched, missing, size, err)
	}
	oid := sha256Hex(content)
	if got, err := os.ReadFile((&lfs.Disk{Dir: lfs.Dir(data)}).Path(oid)); err != nil || !bytes.Equal(got, content) {
		t.Fatalf("stored object: %d bytes, %v", len(got), err)
	}
	if n, _, err := lfs.RepoUsage(ctx, data, "copy"); err != nil || n != 1 {
		t.Fatalf("the imported repository holds %d objects (%v), want 1", n, err)
	}
	if fetched, _, _, err := lfs.FetchObjects(ctx, data, "copy", bare, source, "alice", a.alice.token); err != nil || fetched != 0 {
		t.Fatalf("second fetch: %d fetched, %v", fetched, err)
	}
}
