package rtt

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseURL(t *testing.T) {
	cases := []struct {
		in, transport, user, host string
		port                      int
	}{
		{"git://example.com/team/app", Git, "", "example.com", 9418},
		{"git://127.0.0.1:19418/team/app", Git, "", "127.0.0.1", 19418},
		{"http://h:8080/team/app.git", HTTP, "", "h", 8080},
		{"https://alice@github.com/x/y", HTTPS, "alice", "github.com", 443},
		{"ssh://git@[::1]:2222/team/app", SSH, "git", "::1", 2222},
		{"git+ssh://h/x", SSH, "", "h", 22},
		{"git@github.com:x/y.git", SSH, "git", "github.com", 22},
		{"myalias:repo", SSH, "", "myalias", 22},
	}
	for _, c := range cases {
		got, err := ParseURL(c.in)
		if err != nil {
			t.Errorf("ParseURL(%q): %v", c.in, err)
			continue
		}
		if got.Transport != c.transport || got.User != c.user || got.Host != c.host || got.Port != c.port {
			t.Errorf("ParseURL(%q) = %+v", c.in, got)
		}
	}
	bad := map[string]string{
		"":                      "empty",
		"/srv/git/app.git":      "not a remote URL",
		"./a/b:c":               "not a remote URL",
		"file:///srv/app.git":   "local repository",
		"ftp://h/x":             "unsupported URL scheme",
		"git://h":               "no repository path",
		"http:///x":             "no host",
		"ssh://h:99999/x":       "bad port",
		"[git@h:22]:x":          "bracketed",
		"-oProxyCommand=x:repo": "invalid host",
		"git://h/a b":           "white space",
	}
	for in, want := range bad {
		if _, err := ParseURL(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) error %v, want %q", in, err, want)
		}
	}
}

func TestThrough(t *testing.T) {
	proxy := "127.0.0.1:40000"
	for _, c := range []struct{ in, url, config string }{
		{"git://example.com/team/app", "git://127.0.0.1:40000/team/app", ""},
		{"http://127.0.0.1:8080/team/app", "http://127.0.0.1:40000/team/app", ""},
		// A host name stays, for TLS and virtual hosts; curl resolves it to the proxy.
		{"https://example.com/team/app.git", "https://example.com:40000/team/app.git", "http.curloptResolve=example.com:40000:127.0.0.1"},
		{"ssh://git@example.com:2222/team/app", "ssh://git@example.com:2222/team/app", ""},
	} {
		tg, err := ParseURL(c.in)
		if err != nil {
			t.Fatal(err)
		}
		u, config := tg.Through(proxy)
		if u != c.url || strings.Join(config, " ") != c.config {
			t.Errorf("Through(%s) = %s %v, want %s %s", c.in, u, config, c.url, c.config)
		}
	}
	tg, _ := ParseURL("git@example.com:team/app")
	if opts := strings.Join(tg.SSHOptions(proxy), " "); !strings.Contains(opts, "HostName=127.0.0.1") || !strings.Contains(opts, "Port=40000") {
		t.Errorf("SSH options %s", opts)
	}
}

func TestFitLine(t *testing.T) {
	// wall = 30 ms + 4 x RTT exactly.
	var pts []Point
	for _, d := range []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond} {
		pts = append(pts, Point{Delay: d, Wall: 30*time.Millisecond + 4*d})
	}
	f := FitLine(pts)
	if !f.OK || math.Abs(f.PerRTT-4) > 1e-9 || (f.Base-30*time.Millisecond).Abs() > time.Microsecond {
		t.Errorf("fit %+v, want 30ms + 4 x RTT", f)
	}
	if f := FitLine(pts[:1]); f.OK {
		t.Errorf("one point fitted: %+v", f)
	}
	if f := FitLine([]Point{pts[1], pts[1]}); f.OK {
		t.Errorf("one delay twice fitted: %+v", f)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{"ssh": "ssh", "ControlPath=/tmp/a b": "'ControlPath=/tmp/a b'", "it's": `'it'\''s'`, "": "''"} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
	if !slices.Contains(ReusesFor(SSH), ReuseControlMaster) || len(ReusesFor(Git)) != 1 {
		t.Error("reuse variants")
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"git://h/x", "https://u@h:1/x", "ssh://[::1]:22/x", "git@h:x", "a:b", "file:///x", "h:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseURL(s)
		if err != nil {
			return
		}
		if tg.Host == "" || tg.Port < 1 || tg.Port > 65535 || tg.DialAddr == "" {
			t.Fatalf("ParseURL(%q) = %+v", s, tg)
		}
		if strings.HasPrefix(tg.Host, "-") {
			t.Fatalf("ParseURL(%q): host %q would be read as an ssh option", s, tg.Host)
		}
		u, _ := tg.Through("127.0.0.1:1")
		if tg.Transport != SSH {
			if _, err := ParseURL(u); err != nil {
				t.Fatalf("Through(%q) = %q, which does not parse: %v", s, u, err)
			}
		}
	})
}
