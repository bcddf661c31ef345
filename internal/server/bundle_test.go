package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/governor"
	"packwire/internal/maintain"
	"packwire/internal/pipeline"
	"packwire/internal/pktline"
)

// maintainedWithPush makes a repository, runs a full maintenance run (which
// writes its clone bundle) and pushes a commit after it: the bundle lacks
// that commit. It returns the repository's path and the pushed head.
func (s *testServer) maintainedWithPush(t *testing.T, name string) (string, string) {
	t.Helper()
	bare := s.seed(t, name)
	r, err := s.Data.Repos.Resolve(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Maintainer.Run(context.Background(), r, maintain.Full, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bare, maintain.BundleFile)); err != nil {
		t.Fatalf("no clone bundle after a full run: %v", err)
	}
	return bare, pushCommit(t, s, name, "after-bundle.txt")
}

// TestCloneWithBundleURIEveryTransport: git 2.39's `clone --bundle-uri`
// pointing at packwire's /NAME.git/bundle, then at the repository over
// git://, SSH and HTTP (protocol v0 and v2): the clone is complete (it
// has the commit pushed after the bundle was written), fsck-clean; the
// governor records the bundle's download (kind bundle, every byte of the
// file) and a fetch that was incremental (haves: the bundle's refs), not
// a full clone. Over v2 every transport advertises bundle-uri, which
// this client ignores. The have check passed the bundle's haves without
// git (reach.Checker.Bundle) and git ACKed them; a later fetch whose have
// is outside the bundle still has it checked by git.
func TestCloneWithBundleURIEveryTransport(t *testing.T) {
	t.Parallel()
	enableSSH, sshEnvFor := withSSH(t)
	s := startServer(t, func(c *Config) {
		enableSSH(c)
		c.MaintainInterval = 0
	})
	sshEnv := sshEnvFor(s)
	for _, tc := range transportCases(s, sshEnv) {
		t.Run(tc.name, func(t *testing.T) {
			name := "bundled/" + tc.name
			bare, head := s.maintainedWithPush(t, name)
			fi, err := os.Stat(filepath.Join(bare, maintain.BundleFile))
			if err != nil {
				t.Fatal(err)
			}
			settle(t, bare)
			seq := s.lastSeq(t)
			// Both branches deleted since: their tips are in the bundle
			// (given to every reader) but no ref reaches them.
			bundleTip := s.env.RevParse(bare, "branch0")
			s.env.Git("", "push", "-q", s.pushURL(name), ":refs/heads/branch0", ":refs/heads/branch1")
			checks := s.Pipeline.Reach.GitRuns()
			dir := filepath.Join(t.TempDir(), "c")
			out := tc.run(t, s, "", "clone", "--bundle-uri="+s.httpURL(name+".git/bundle"), tc.url(name), dir)
			// The bundle's haves (its tip is no ref's any more) passed
			// the have check without git, and git ACKed them.
			if n := s.Pipeline.Reach.GitRuns() - checks; n != 0 {
				t.Errorf("the have check ran git %d times for haves the bundle holds", n)
			}
			if tc.version == 0 && !strings.Contains(out, "ACK "+bundleTip) { // v2 sends done at once: no ACKs
				t.Errorf("the bundle's tip %s was not ACKed:\n%s", bundleTip, lastLines(out, 40))
			}
			if tc.version == 2 && !strings.Contains(out, "< bundle-uri") {
				t.Fatalf("v2 advertisement without bundle-uri:\n%s", lastLines(out, 40))
			}
			if got := s.env.RevParse(dir, "origin/main"); got != head {
				t.Fatalf("clone has main at %s, want the push after the bundle %s", got, head)
			}
			if out, err := s.env.Run(dir, nil, "fsck", "--full", "--strict", "--no-dangling"); err != nil {
				t.Fatalf("fsck: %v\n%s", err, out)
			}
			recs := s.recordsAfter(t, seq, func(r []governor.Record) bool {
				var b, f bool
				for _, x := range r {
					b = b || x.Kind == pipeline.KindBundle
					f = f || x.Kind == "incremental-fetch" || x.Kind == "full-clone"
				}
				return b && f
			})
			for _, r := range recs {
				switch {
				case r.Kind == pipeline.KindBundle:
					if r.Result != governor.ResultOK || r.BytesOut != fi.Size() || r.Repo != name || r.CPU() != 0 {
						t.Fatalf("bundle record %+v, want ok, %d bytes, no git", r, fi.Size())
					}
				case r.Kind == "full-clone":
					t.Fatalf("the clone after the bundle fetched everything: %+v", r)
				case r.Kind == "incremental-fetch":
					if r.Haves == 0 {
						t.Fatalf("fetch after the bundle without haves: %+v", r)
					}
					// Only what the bundle lacks: its haves were common.
					if r.BytesOut > fi.Size()/4 {
						t.Fatalf("fetch after the bundle sent %d bytes, the bundle has %d: %+v", r.BytesOut, fi.Size(), r)
					}
				}
			}
			// A have outside the bundle (the commit pushed after it, no
			// longer a tip) still goes to git, and is ACKed.
			next := pushCommit(t, s, name, "after-clone.txt")
			checks = s.Pipeline.Reach.GitRuns()
			out = tc.run(t, s, dir, "fetch", "origin")
			if s.Pipeline.Reach.GitRuns() == checks {
				t.Errorf("a have outside the bundle passed without git")
			}
			if !strings.Contains(out, "ACK "+head) {
				t.Errorf("the fetch's have %s was not ACKed:\n%s", head, lastLines(out, 40))
			}
			if got := s.env.RevParse(dir, "origin/main"); got != next {
				t.Fatalf("fetch has main at %s, want %s", got, next)
			}
		})
	}
}

// TestBundleURICommand: the v2 bundle-uri command, in hand-written
// pkt-lines (git 2.39 never sends it), over HTTP and git://: advertised
// where the repository has a bundle, answered with bundle.version=1,
// bundle.mode=all and the bundle's absolute URL (the HTTP listener's);
// a repository without one advertises nothing and refuses the command in
// git's words.
func TestBundleURICommand(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MaintainInterval = 0 })
	s.maintainedWithPush(t, "team/app")
	s.seed(t, "plain")
	want := "bundle.version=1\nbundle.mode=all\nbundle.packwire.uri=" + s.httpURL("team/app.git/bundle") + "\n"
	command := string(mustPkt("command=bundle-uri\n")) + string(mustPkt("agent=git/test\n")) + "0001" + "0000"

	post := func(repo string) string {
		t.Helper()
		req, _ := http.NewRequest("POST", s.httpURL(repo+"/git-upload-pack"), strings.NewReader(command))
		req.Header.Set("Git-Protocol", "version=2")
		req.Header.Set("Content-Type", "application/x-git-upload-pack-request")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return payloads(t, string(b))
	}
	caps := func(repo string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", s.httpURL(repo+"/info/refs?service=git-upload-pack"), nil)
		req.Header.Set("Git-Protocol", "version=2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return payloads(t, string(b))
	}
	if got := caps("team/app"); !strings.Contains(got, "\nbundle-uri\n") {
		t.Fatalf("HTTP advertisement without bundle-uri:\n%s", got)
	}
	if got := post("team/app"); got != want+"|flush\n" {
		t.Fatalf("HTTP bundle-uri answer:\n%q\nwant\n%q", got, want+"|flush\n")
	}
	if got := caps("plain"); strings.Contains(got, "bundle-uri") {
		t.Fatalf("advertised bundle-uri without a bundle:\n%s", got)
	}
	if got := post("plain"); !strings.Contains(got, "ERR invalid command 'bundle-uri'") {
		t.Fatalf("bundle-uri without a bundle: %q", got)
	}

	// git://: the session's advertisement, then the command in the session.
	conn, err := net.Dial("tcp", s.GitAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second)) // a safety net only
	conn.Write(request("git-upload-pack", "/team/app", "\x00version=2\x00"))
	pr := pktline.NewReader(conn)
	readUntilFlush := func() string {
		var b strings.Builder
		for {
			kind, p, err := pr.Read()
			if err != nil {
				t.Fatalf("git:// read: %v (so far %q)", err, b.String())
			}
			if kind == pktline.Flush {
				return b.String()
			}
			b.Write(p)
		}
	}
	if got := readUntilFlush(); !strings.Contains(got, "\nbundle-uri\n") {
		t.Fatalf("git:// advertisement without bundle-uri:\n%s", got)
	}
	conn.Write([]byte(command))
	if got := readUntilFlush(); got != want {
		t.Fatalf("git:// bundle-uri answer %q, want %q", got, want)
	}
}

// payloads renders a pkt-line stream as its payloads, a flush as "|flush".
func payloads(t *testing.T, stream string) string {
	t.Helper()
	var b strings.Builder
	pr := pktline.NewReader(strings.NewReader(stream))
	for {
		kind, p, err := pr.Read()
		if err != nil {
			return b.String()
		}
		switch kind {
		case pktline.Flush:
			b.WriteString("|flush\n")
		case pktline.Data:
			b.Write(p)
		default:
			fmt.Fprintf(&b, "|%v\n", kind)
		}
	}
}

// TestBundleHTTPFile: /NAME.git/bundle is the bundle file as a static
// file under the repository's read access: the whole file with an ETag
// and Last-Modified, 304 for a matching If-None-Match, 206 for a Range,
// HEAD without a body; 404 for a repository without a bundle; 401 for
// anonymous once anonymous read is off, the file for a user who may read.
func TestBundleHTTPFile(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) { c.MaintainInterval = 0 })
	bare, _ := s.maintainedWithPush(t, "team/app")
	s.seed(t, "plain")
	file, err := os.ReadFile(filepath.Join(bare, maintain.BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	get := func(method, url string, header ...string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, url, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	url := s.httpURL("team/app.git/bundle")
	resp, body := get("GET", url)
	etag := resp.Header.Get("ETag")
	if resp.StatusCode != 200 || string(body) != string(file) || etag == "" || resp.Header.Get("Last-Modified") == "" {
		t.Fatalf("GET: %d, %d bytes of %d, ETag %q, Last-Modified %q", resp.StatusCode, len(body), len(file), etag, resp.Header.Get("Last-Modified"))
	}
	if resp, _ := get("GET", s.httpURL("team/app/bundle")); resp.StatusCode != 200 {
		t.Fatalf("GET without .git: %d", resp.StatusCode)
	}
	if resp, body := get("GET", url, "If-None-Match", etag); resp.StatusCode != http.StatusNotModified || len(body) != 0 {
		t.Fatalf("If-None-Match: %d, %d bytes", resp.StatusCode, len(body))
	}
	if resp, body := get("GET", url, "Range", "bytes=0-15"); resp.StatusCode != http.StatusPartialContent || string(body) != "# v2 git bundle\n" {
		t.Fatalf("Range: %d %q", resp.StatusCode, body)
	}
	if resp, body := get("GET", url, "Range", fmt.Sprintf("bytes=%d-", len(file)-20)); resp.StatusCode != http.StatusPartialContent || string(body) != string(file[len(file)-20:]) {
		t.Fatalf("Range to the end: %d, %d bytes", resp.StatusCode, len(body))
	}
	if resp, body := get("HEAD", url); resp.StatusCode != 200 || len(body) != 0 || resp.ContentLength != int64(len(file)) {
		t.Fatalf("HEAD: %d, %d bytes, length %d", resp.StatusCode, len(body), resp.ContentLength)
	}
	if resp, _ := get("POST", url); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", resp.StatusCode)
	}
	if resp, _ := get("GET", s.httpURL("plain.git/bundle")); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("no bundle: %d", resp.StatusCode)
	}
	if resp, _ := get("GET", s.httpURL("nope.git/bundle")); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("no repository: %d", resp.StatusCode)
	}
	if err := s.Data.Store.SetSetting(context.Background(), "anonymous-read", "off"); err != nil {
		t.Fatal(err)
	}
	if resp, _ := get("GET", url); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous without anonymous read: %d", resp.StatusCode)
	}
	if resp, body := get("GET", s.pushURL("team/app.git/bundle")); resp.StatusCode != 200 || len(body) != len(file) {
		t.Fatalf("alice: %d, %d bytes", resp.StatusCode, len(body))
	}
}
