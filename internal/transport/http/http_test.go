package http

import (
	"io"
	nethttp "net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

func TestRoute(t *testing.T) {
	cases := map[string][2]string{
		"/team/app.git/info/refs":      {"/team/app.git", "info/refs"},
		"/app/git-upload-pack":         {"/app", "git-upload-pack"},
		"/a/b/c/git-receive-pack":      {"/a/b/c", "git-receive-pack"},
		"/info/refs/info/refs":         {"/info/refs", "info/refs"},
		"/app/git-upload-pack/":        {"", ""},
		"/info/refs":                   {"", ""},
		"/app/HEAD":                    {"", ""},
		"/app/objects/info/alternates": {"", ""},
	}
	for in, want := range cases {
		repo, ep, ok := Route(in)
		if ok != (want[1] != "") || repo != want[0] || ep != want[1] {
			t.Errorf("Route(%q) = %q %q %v, want %q %q", in, repo, ep, ok, want[0], want[1])
		}
	}
}

// FuzzRoute: an accepted path always splits into a non-empty repository
// part and a known endpoint that together make up the whole path.
func FuzzRoute(f *testing.F) {
	for _, s := range []string{"/a/info/refs", "/git-upload-pack", "//git-receive-pack", "/../x/info/refs"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		repo, ep, ok := Route(path)
		if !ok {
			return
		}
		if repo == "" || repo+"/"+ep != path {
			t.Fatalf("Route(%q) = %q %q", path, repo, ep)
		}
		switch ep {
		case "info/refs", "git-upload-pack", "git-receive-pack":
		default:
			t.Fatalf("endpoint %q", ep)
		}
		if strings.HasSuffix(repo, "/") && repo != "/" && !strings.HasSuffix(path, "//"+ep) {
			t.Fatalf("repo %q", repo)
		}
	})
}

// TestServeAndStreamFile: a whole file goes out with its Content-Length;
// a file still growing goes out close-delimited over HTTP/1.1 (no chunks,
// so net/http can use sendfile), and chunked once something was written.
func TestServeAndStreamFile(t *testing.T) {
	content := strings.Repeat("0123456789abcdef", 40_000)
	f, err := os.CreateTemp(t.TempDir(), "body")
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(content)
	f.Close()
	mode := ""
	srv := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		file, _ := os.Open(f.Name())
		defer file.Close()
		out := &streamWriter{w: w, contentType: "application/x-git-upload-pack-result", idle: time.Second,
			closeDelimitedOK: r.ProtoMajor == 1 && r.ProtoMinor >= 1}
		var n int64
		var err error
		switch mode {
		case "serve":
			n, err = out.ServeFile(file, int64(len(content)))
		case "stream":
			for _, part := range []int64{1000, 300_000, int64(len(content)) - 301_000} {
				var m int64
				m, err = out.StreamFile(file, part)
				n += m
			}
		case "started":
			out.Write([]byte(content[:10]))
			file.Seek(10, io.SeekStart)
			n, err = out.StreamFile(file, int64(len(content))-10)
			n += 10
		}
		if err != nil || n != int64(len(content)) {
			t.Errorf("%s: sent %d, %v", mode, n, err)
		}
	}))
	defer srv.Close()
	for _, m := range []string{"serve", "stream", "started"} {
		mode = m
		resp, err := nethttp.Post(srv.URL, "application/x-git-upload-pack-request", strings.NewReader("0000"))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != content {
			t.Fatalf("%s: body of %d bytes, %v", m, len(body), err)
		}
		chunked := len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked"
		switch m {
		case "serve":
			if resp.ContentLength != int64(len(content)) || chunked || resp.Close {
				t.Errorf("serve: length %d, chunked %v, close %v", resp.ContentLength, chunked, resp.Close)
			}
		case "stream":
			if resp.ContentLength != -1 || chunked || !resp.Close || resp.Header.Get("Transfer-Encoding") != "" {
				t.Errorf("stream: length %d, chunked %v, close %v, %v", resp.ContentLength, chunked, resp.Close, resp.Header)
			}
		case "started":
			if !chunked || resp.Close {
				t.Errorf("started: chunked %v, close %v", chunked, resp.Close)
			}
		}
		if resp.Header.Get("Content-Type") != "application/x-git-upload-pack-result" {
			t.Errorf("%s: content type %q", m, resp.Header.Get("Content-Type"))
		}
	}
}
