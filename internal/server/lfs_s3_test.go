package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"packwire/internal/access"
	"packwire/internal/s3test"
)

// startLFSS3Server is startLFSServer with its objects in a fresh bucket
// of the shared weed.
func startLFSS3Server(t *testing.T) (*accessServer, *s3test.Server, string) {
	t.Helper()
	requireGitLFS(t)
	weed := s3test.Shared(t)
	bucket := weed.NewBucket(t)
	store := weed.StoreURL(t, bucket)
	a := startAccessServerWith(t, func(c *Config) { c.LFSStore = store })
	a.env.Git("", "lfs", "install", "--skip-repo")
	return a, weed, bucket
}

// TestLFSS3: git-lfs pushes through packwire into the bucket; a clone's
// batch answer hands out a pre-signed URL of the S3 endpoint (the bytes
// never pass through packwire) to a reader of the repository only; a
// wrong upload leaves nothing in the bucket.
func TestLFSS3(t *testing.T) {
	t.Parallel()
	a, weed, bucket := startLFSS3Server(t)
	a.grant(t, "alice", "write", "**")
	bob := a.addUser(t, "bob")
	a.grant(t, "bob", "write", "lfs/b")
	ctx := context.Background()
	if err := a.Data.Store.SetSetting(ctx, access.SettingAnonRead, "off"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"lfs/app", "lfs/b"} {
		if _, err := a.Data.Repos.Create(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	content := randomBytes(21, 200<<10)
	oid := sha256Hex(content)

	// A wrong upload first: 422, and the bucket stays empty.
	if status, body, _ := a.lfsRequest(t, a.alice, "PUT", "lfs/app", "objects/"+oid, bytes.NewReader(randomBytes(22, len(content))), int64(len(content))); status != 422 || !strings.Contains(body, "hash mismatch") {
		t.Fatalf("wrong hash: %d %s", status, body)
	}
	if objects, uploads := weed.Keys(t, bucket); len(objects)+len(uploads) != 0 {
		t.Fatalf("a wrong upload left %v %v in the bucket", objects, uploads)
	}

	w := a.lfsWork(t, content)
	if out, err := a.git(t, w, "http", a.alice, "lfs/app", "push", "URL", "HEAD:refs/heads/main"); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	if objects, _ := weed.Keys(t, bucket); len(objects) != 1 || objects[0] != "lfs/"+oid {
		t.Fatalf("bucket holds %v, want lfs/%s", objects, oid)
	}
	if objects, _ := a.lfsObjectFiles(t); len(objects) != 0 {
		t.Fatalf("the disk store holds %v", objects)
	}

	// The batch answer: a pre-signed URL of the S3 endpoint, with no
	// Authorization header, good for as long as expires_in says.
	status, body, _ := a.lfsRequest(t, a.alice, "POST", "lfs/app", "objects/batch", strings.NewReader(batchBody("download", oid, len(content))), -1)
	var answer struct {
		Objects []struct {
			Actions map[string]struct {
				Href      string            `json:"href"`
				Header    map[string]string `json:"header"`
				ExpiresIn int               `json:"expires_in"`
			} `json:"actions"`
		} `json:"objects"`
	}
	if err := json.Unmarshal([]byte(body), &answer); status != 200 || err != nil || len(answer.Objects) != 1 {
		t.Fatalf("batch: %d %s", status, body)
	}
	dl := answer.Objects[0].Actions["download"]
	if !strings.HasPrefix(dl.Href, weed.Endpoint+"/"+bucket+"/lfs/"+oid+"?") || !strings.Contains(dl.Href, "X-Amz-Expires=3600") ||
		dl.ExpiresIn != 3600 || dl.Header["Authorization"] != "" {
		t.Fatalf("download action %+v, want a pre-signed URL of %s good for 3600 s", dl, weed.Endpoint)
	}
	resp, err := http.Get(dl.Href)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, content) {
		t.Fatalf("GET of the pre-signed URL: %d, %d bytes", resp.StatusCode, len(got))
	}

	// A clone smudges the file from the bucket: packwire records no
	// download (the bytes went from weed to git-lfs).
	before := strings.Count(a.logs.String(), "kind=lfs-download")
	c := filepath.Join(t.TempDir(), "c")
	if out, err := a.git(t, "", "http", a.alice, "lfs/app", "clone", "-q", "URL", c); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(c, "a.bin")); !bytes.Equal(got, content) {
		t.Fatalf("cloned a.bin is %d bytes, not the pushed content", len(got))
	}
	if n := strings.Count(a.logs.String(), "kind=lfs-download"); n != before {
		t.Fatalf("packwire served %d downloads itself", n-before)
	}

	// Per repository: bob cannot read lfs/app (404), and lfs/b, which he
	// may read, does not hold the object though the bucket does: no URL.
	for _, c := range []struct{ repo, want string }{{"lfs/app", "not found"}, {"lfs/b", `"code":404`}} {
		status, body, _ := a.lfsRequest(t, bob, "POST", c.repo, "objects/batch", strings.NewReader(batchBody("download", oid, len(content))), -1)
		if !strings.Contains(body, c.want) || strings.Contains(body, weed.Endpoint) {
			t.Fatalf("bob's batch through %s: %d %s", c.repo, status, body)
		}
	}
}
