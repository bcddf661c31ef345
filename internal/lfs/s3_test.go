package lfs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"packwire/internal/s3test"
)

func TestMain(m *testing.M) { os.Exit(s3test.Main(m)) }

func noise(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestS3Store: against a real S3 server (weed), a verified upload lands
// whole under lfs/OID and is served, listed, removed and pre-signed; a
// wrong hash (of the exact size, in one PUT and in a multipart upload),
// a short and a long body leave nothing in the bucket, not even an
// incomplete multipart upload.
func TestS3Store(t *testing.T) {
	srv := s3test.Shared(t)
	bucket := srv.NewBucket(t)
	ctx := context.Background()
	st, err := OpenS3(ctx, srv.StoreURL(t, bucket))
	if err != nil {
		t.Fatal(err)
	}
	empty := func(what string) {
		t.Helper()
		if objects, uploads := srv.Keys(t, bucket); len(objects) != 0 || len(uploads) != 0 {
			t.Fatalf("%s left objects %v, uploads %v", what, objects, uploads)
		}
	}
	content := noise(1, 100<<10)
	oid := oidOf(content)
	big := noise(2, 17<<20) // over minio-go's 16 MiB part: a multipart upload
	for _, c := range []struct {
		name string
		oid  string
		size int64
		body io.Reader
		want error
	}{
		{"wrong hash", oid, int64(len(content)), bytes.NewReader(noise(3, len(content))), ErrHashMismatch},
		{"short body", oid, int64(len(content)), bytes.NewReader(content[:1000]), ErrSizeMismatch},
		{"long body", oid, int64(len(content)), io.MultiReader(bytes.NewReader(content), strings.NewReader("x")), ErrSizeMismatch},
		{"multipart wrong hash", oidOf(content), int64(len(big)), bytes.NewReader(big), ErrHashMismatch},
	} {
		if _, err := st.Put(c.oid, c.size, c.body); !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want)
		}
		if _, ok := st.Stat(c.oid); ok {
			t.Fatalf("%s: the object is there", c.name)
		}
		empty(c.name)
	}

	for _, b := range [][]byte{content, big, {}} {
		if n, err := st.Put(oidOf(b), int64(len(b)), bytes.NewReader(b)); err != nil || n != int64(len(b)) {
			t.Fatalf("put of %d bytes: %d, %v", len(b), n, err)
		}
		if size, ok := st.Stat(oidOf(b)); !ok || size != int64(len(b)) {
			t.Fatalf("stat: %d %v", size, ok)
		}
	}
	if objects, uploads := srv.Keys(t, bucket); len(objects) != 3 || len(uploads) != 0 || !strings.HasPrefix(objects[0], "lfs/") {
		t.Fatalf("bucket holds %v, uploads %v; want 3 objects under lfs/", objects, uploads)
	}
	f, fi, err := st.Open(oid)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if !bytes.Equal(got, content) || fi.Size() != int64(len(content)) {
		t.Fatalf("open: %d bytes (size %d)", len(got), fi.Size())
	}
	// The pre-signed URL serves the content without credentials.
	u, err := st.DownloadURL(ctx, oid, time.Hour)
	if err != nil || !strings.HasPrefix(u, srv.Endpoint+"/"+bucket+"/lfs/"+oid) || !strings.Contains(u, "X-Amz-Signature=") {
		t.Fatalf("download URL %q, %v", u, err)
	}
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(got, content) {
		t.Fatalf("pre-signed GET: %d, %d bytes", resp.StatusCode, len(got))
	}
	// A tampered signature is refused by the store.
	if resp, err := http.Get(strings.Replace(u, "X-Amz-Expires=3600", "X-Amz-Expires=7200", 1)); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("tampered URL: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	var walked []string
	if err := st.Walk(ctx, func(o string, size int64, stored time.Time) error {
		walked = append(walked, o)
		return nil
	}); err != nil || len(walked) != 3 {
		t.Fatalf("walk: %v %v", walked, err)
	}
	for _, b := range [][]byte{content, big, {}} {
		if err := st.Remove(oidOf(b)); err != nil {
			t.Fatal(err)
		}
	}
	empty("removing every object")
}

// TestS3StoreURL: the store URL's mistakes are told before anything runs.
func TestS3StoreURL(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	for _, c := range []struct{ url, want string }{
		{"s3:///x", "s3://BUCKET"},
		{"gs://b", "s3://BUCKET"},
		{"s3://key:secret@b?endpoint=http://127.0.0.1:1", "credentials do not go in the URL"},
		{"s3://b?endpoint=ftp://x", "http(s)://HOST"},
		{"s3://b?endpoint=http://127.0.0.1:1", "no S3 credentials"},
	} {
		if _, err := OpenS3(context.Background(), c.url); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.url, err, c.want)
		}
	}
}
