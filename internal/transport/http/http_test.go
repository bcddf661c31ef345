package http

import (
	"strings"
	"testing"
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
