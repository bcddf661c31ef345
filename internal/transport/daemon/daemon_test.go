package daemon

import (
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		in   string
		want Request
		bad  bool
	}{
		{in: "git-upload-pack /team/app.git\x00host=example.com:9418\x00", want: Request{Service: "git-upload-pack", Path: "/team/app.git", Host: "example.com:9418"}},
		{in: "git-upload-pack /x\x00host=h\x00\x00version=2\x00", want: Request{Service: "git-upload-pack", Path: "/x", Host: "h", Protocol: "version=2"}},
		{in: "git-upload-pack /x\x00host=h\x00\x00version=2\x00object-format=sha1\x00", want: Request{Service: "git-upload-pack", Path: "/x", Host: "h", Protocol: "version=2:object-format=sha1"}},
		{in: "git-upload-pack /x\x00\x00version=2\x00", want: Request{Service: "git-upload-pack", Path: "/x", Protocol: "version=2"}},
		{in: "git-upload-pack /x\x00host=h\x00\n", want: Request{Service: "git-upload-pack", Path: "/x", Host: "h"}},
		{in: "git-upload-pack /x", bad: true},
		{in: "git-upload-pack\x00", bad: true},
		{in: " /x\x00", bad: true},
		{in: "git-upload-pack /x\x00notahost\x00", bad: true},
	}
	for _, c := range cases {
		got, err := ParseRequest([]byte(c.in))
		if c.bad {
			if err == nil {
				t.Errorf("%q: parsed as %+v", c.in, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: got %+v %v, want %+v", c.in, got, err, c.want)
		}
	}
}

// FuzzParseRequest: no input panics, and an accepted request always has a
// service and a path without NUL bytes.
func FuzzParseRequest(f *testing.F) {
	f.Add([]byte("git-upload-pack /x\x00host=h\x00\x00version=2\x00"))
	f.Add([]byte("git-receive-pack /a/b.git\x00"))
	f.Add([]byte("\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := ParseRequest(in)
		if err != nil {
			return
		}
		if r.Service == "" || r.Path == "" || strings.ContainsRune(r.Path, 0) || strings.ContainsRune(r.Protocol, 0) {
			t.Fatalf("accepted %q as %+v", in, r)
		}
	})
}
