package dashboard

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"packwire/internal/access"
	"packwire/internal/datadir"
	"packwire/internal/fetchcache"
	"packwire/internal/gittest"
	"packwire/internal/governor"
	"packwire/internal/lfs"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

type fixture struct {
	h            *Handler
	data         *datadir.Data
	gov          *governor.Governor
	admin, write string // tokens of root (admin on **) and alice (write on **)
	recordID     string // a request record only an admin may see
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	data, err := datadir.Create(ctx, filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { data.Close() })
	gov, err := governor.Open(ctx, filepath.Join(data.Dir, governor.FileName))
	if err != nil {
		t.Fatal(err)
	}
	gov.Start(governor.Options{FlushInterval: 5 * time.Millisecond})
	t.Cleanup(func() { gov.Close() })
	f := &fixture{data: data, gov: gov}
	for _, u := range []struct{ name, role string }{{"root", "admin"}, {"alice", "write"}} {
		if _, err := data.Store.AddUser(ctx, u.name); err != nil {
			t.Fatal(err)
		}
		if err := data.Store.SetGrant(ctx, store.Grant{User: u.name, RepoPattern: "**", Role: u.role}); err != nil {
			t.Fatal(err)
		}
	}
	if f.admin, err = data.Access.CreateToken(ctx, "root", 0); err != nil {
		t.Fatal(err)
	}
	if f.write, err = data.Access.CreateToken(ctx, "alice", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := data.Repos.Create(ctx, "team/secret"); err != nil {
		t.Fatal(err)
	}
	rec := governor.Record{ID: governor.NewID(time.Now()), Start: time.Now(), Transport: "http", Repo: "team/secret", User: "alice",
		Kind: "full-clone", Service: "git-upload-pack", Wall: governor.Duration(time.Second), UserCPU: governor.Duration(1234 * time.Millisecond), Result: "ok"}
	f.recordID = rec.ID
	gov.Record(rec)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if recs, _ := gov.Last(ctx, 1); len(recs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("record not written")
		}
	}
	labDir := filepath.Join(t.TempDir(), "lab")
	os.MkdirAll(filepath.Join(labDir, "run1"), 0o755)
	os.WriteFile(filepath.Join(labDir, "run1", ReportFile), []byte("<html><body><p>secret report</p></body></html>"), 0o644)
	os.WriteFile(filepath.Join(labDir, "run1", "samples.csv"), []byte("scenario,wall_s\nT1,2.1\n"), 0o644)
	os.WriteFile(filepath.Join(labDir, "run1", "notes.key"), []byte("not served"), 0o644)
	// A run directory that is a symlink out of the lab: never listed or served.
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, ReportFile), []byte("outside"), 0o644)
	os.Symlink(outside, filepath.Join(labDir, "escape"))
	f.h = &Handler{Access: data.Access, Governor: gov, Repos: data.Repos, LabDir: labDir,
		GitAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9418}, SSHAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2222}}
	return f
}

type reqOpt func(*http.Request)

func basic(token string) reqOpt { return func(r *http.Request) { r.SetBasicAuth("token", token) } }
func cookie(c *http.Cookie) reqOpt {
	return func(r *http.Request) { r.AddCookie(c) }
}
func origin(o string) reqOpt { return func(r *http.Request) { r.Header.Set("Origin", o) } }

func (f *fixture) do(method, target string, body io.Reader, opts ...reqOpt) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, body)
	r.Host = "dash.example:8080"
	if body != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, o := range opts {
		o(r)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

var pages = []string{"/-/", "/-/now", "/-/now.json", "/-/costs", "/-/costs?window=7d", "/-/repos", "/-/audit", "/-/cluster", "/-/lab", "/-/lab/run1/report.html", "/-/lab/run1/samples.csv"}

func TestWithoutAnAdminOnlyTheLoginForm(t *testing.T) {
	f := newFixture(t)
	for _, who := range []struct {
		name string
		opts []reqOpt
	}{
		{"nobody", nil},
		{"a writer's token", []reqOpt{basic(f.write)}},
		{"a wrong token", []reqOpt{basic(f.admin + "x")}},
		{"a forged session", []reqOpt{cookie(&http.Cookie{Name: cookieName, Value: "forged"})}},
	} {
		for _, p := range pages {
			w := f.do("GET", p, nil, who.opts...)
			body := w.Body.String()
			if w.Code != http.StatusUnauthorized {
				t.Errorf("%s, %s: HTTP %d, want 401", who.name, p, w.Code)
			}
			for _, secret := range []string{"team/secret", f.recordID, "secret report", "1.23 s"} {
				if strings.Contains(body, secret) {
					t.Errorf("%s, %s: the answer shows %q:\n%s", who.name, p, secret, body)
				}
			}
			if strings.HasSuffix(p, ".json") {
				if !strings.Contains(body, "login required") {
					t.Errorf("%s, %s: %s", who.name, p, body)
				}
			} else if !strings.Contains(body, `action="/-/login"`) {
				t.Errorf("%s, %s: no login form:\n%s", who.name, p, body)
			}
		}
	}
	// An admin's token over Basic opens every page.
	for _, p := range pages {
		w := f.do("GET", p, nil, basic(f.admin))
		if w.Code != http.StatusOK && !(p == "/-/" && w.Code == http.StatusSeeOther) {
			t.Errorf("admin, %s: HTTP %d\n%s", p, w.Code, w.Body.String())
		}
	}
	if w := f.do("GET", "/-/repos", nil, basic(f.admin)); !strings.Contains(w.Body.String(), "team/secret") {
		t.Errorf("repos page for the admin lacks the repository:\n%s", w.Body.String())
	}
	if w := f.do("GET", "/-/repos", nil, basic(f.admin)); !strings.Contains(w.Body.String(), "<small>off</small>") {
		t.Errorf("repos page without LFS does not say it is off:\n%s", w.Body.String())
	}
	if w := f.do("GET", "/-/costs?window=1h", nil, basic(f.admin)); !strings.Contains(w.Body.String(), "1.23 s") {
		t.Errorf("costs page for the admin lacks the record's CPU:\n%s", w.Body.String())
	}
}

func TestLoginSessionAndLogout(t *testing.T) {
	f := newFixture(t)
	self := origin("http://dash.example:8080")
	form := func(token string) io.Reader { return strings.NewReader(url.Values{"token": {token}}.Encode()) }

	if w := f.do("POST", "/-/login", form(f.admin)); w.Code != http.StatusForbidden {
		t.Fatalf("login without Origin or Referer: HTTP %d", w.Code)
	}
	if w := f.do("POST", "/-/login", form(f.admin), origin("http://evil.example")); w.Code != http.StatusForbidden {
		t.Fatalf("login from another origin: HTTP %d", w.Code)
	}
	if w := f.do("POST", "/-/login", form(f.admin), origin("null")); w.Code != http.StatusForbidden {
		t.Fatalf("login from an opaque origin: HTTP %d", w.Code)
	}
	if w := f.do("POST", "/-/login", form(f.admin), origin("http://dash.example:8080.evil.example")); w.Code != http.StatusForbidden {
		t.Fatalf("login from a look-alike origin: HTTP %d", w.Code)
	}
	// Behind a proxy that ends TLS the browser's origin says https.
	if w := f.do("POST", "/-/login", form(f.admin), origin("https://dash.example:8080")); w.Code != http.StatusSeeOther {
		t.Fatalf("login through a TLS proxy: HTTP %d", w.Code)
	}
	if w := f.do("POST", "/-/login", form(f.write), self); w.Code != http.StatusUnauthorized || len(w.Result().Cookies()) != 0 ||
		!strings.Contains(w.Body.String(), "not the token of a server admin") {
		t.Fatalf("login with a writer's token: HTTP %d, cookies %v", w.Code, w.Result().Cookies())
	}
	w := f.do("POST", "/-/login", form(f.admin), self)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/-/now" {
		t.Fatalf("login: HTTP %d to %q", w.Code, w.Header().Get("Location"))
	}
	cookies := w.Result().Cookies()
	if len(cookies) != 1 {
		t.Fatalf("login set %d cookies", len(cookies))
	}
	c := cookies[0]
	_, secret, _ := strings.Cut(strings.TrimPrefix(f.admin, "pwt_"), "_")
	if c.Name != cookieName || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/-/" || c.Secure ||
		strings.Contains(c.Value, secret) || len(c.Value) < 40 {
		t.Fatalf("session cookie: %+v", c)
	}
	if w := f.do("GET", "/-/now", nil, cookie(c)); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "root") {
		t.Fatalf("with the session: HTTP %d", w.Code)
	}
	// A form posted from elsewhere with the cookie is refused (SameSite aside).
	if w := f.do("POST", "/-/logout", nil, cookie(c), origin("http://evil.example")); w.Code != http.StatusForbidden {
		t.Fatalf("cross-origin logout: HTTP %d", w.Code)
	}
	if w := f.do("GET", "/-/logout", nil, cookie(c)); w.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET logout: HTTP %d", w.Code)
	}
	w = f.do("POST", "/-/logout", nil, cookie(c), self)
	if w.Code != http.StatusSeeOther || len(w.Result().Cookies()) != 1 || w.Result().Cookies()[0].MaxAge >= 0 {
		t.Fatalf("logout: HTTP %d, cookies %v", w.Code, w.Result().Cookies())
	}
	if w := f.do("GET", "/-/now", nil, cookie(c)); w.Code != http.StatusUnauthorized {
		t.Fatalf("the session outlived the logout: HTTP %d", w.Code)
	}

	// Revoking the token, or the admin role, ends a session opened with it.
	ctx := context.Background()
	var err error
	login := func() *http.Cookie {
		w := f.do("POST", "/-/login", form(f.admin), self)
		if w.Code != http.StatusSeeOther {
			t.Fatalf("login: HTTP %d", w.Code)
		}
		return w.Result().Cookies()[0]
	}
	c = login()
	if err := f.data.Store.RemoveGrant(ctx, "root", "**"); err != nil {
		t.Fatal(err)
	}
	if w := f.do("GET", "/-/now", nil, cookie(c)); w.Code != http.StatusUnauthorized {
		t.Fatalf("after the admin role went: HTTP %d", w.Code)
	}
	f.data.Store.SetGrant(ctx, store.Grant{User: "root", RepoPattern: "**", Role: "admin"})
	c = login()
	if err := f.data.Store.RevokeToken(ctx, access.TokenID(f.admin)); err != nil {
		t.Fatal(err)
	}
	if w := f.do("GET", "/-/now", nil, cookie(c)); w.Code != http.StatusUnauthorized {
		t.Fatalf("after the token was revoked: HTTP %d", w.Code)
	}
	// An expired session is gone too.
	if f.admin, err = f.data.Access.CreateToken(ctx, "root", 0); err != nil {
		t.Fatal(err)
	}
	c = login()
	f.h.sessions.mu.Lock()
	s := f.h.sessions.m[c.Value]
	s.expires = time.Now().Add(-time.Second)
	f.h.sessions.m[c.Value] = s
	f.h.sessions.mu.Unlock()
	if w := f.do("GET", "/-/now", nil, cookie(c)); w.Code != http.StatusUnauthorized {
		t.Fatalf("an expired session still works: HTTP %d", w.Code)
	}
}

func TestSecurityHeadersAndOddPaths(t *testing.T) {
	f := newFixture(t)
	for _, p := range []string{"/-/login", "/-/now"} {
		w := f.do("GET", p, nil, basic(f.admin))
		if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("%s: CSP %q", p, csp)
		}
		if w.Header().Get("X-Frame-Options") != "DENY" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: headers %v", p, w.Header())
		}
		// No inline script or style on any page: the CSP would block them.
		if b := w.Body.String(); strings.Contains(b, "<script>") || strings.Contains(b, "<style") || strings.Contains(b, " style=") || strings.Contains(b, "onclick") {
			t.Errorf("%s: inline script or style:\n%s", p, b)
		}
	}
	for _, p := range []string{"/-/nope", "/-/now/", "/-//now", "/-/static/../now", "/-/static/", "/-/lab/", "/-/lab/run1",
		"/-/lab/../data/packwire.db", "/-/lab/run1/../../x.html", "/-/lab/run1/report.html/x", "/-/lab/.hidden/report.html",
		"/-/lab/run1/notes.key", "/-/lab/escape/report.html", "/-/lab/run1/missing.html", "/-/lab/%2e%2e/report.html"} {
		w := f.do("GET", p, nil, basic(f.admin))
		if w.Code != http.StatusNotFound {
			t.Errorf("%s: HTTP %d, want 404", p, w.Code)
		}
		if strings.Contains(w.Body.String(), "outside") {
			t.Errorf("%s: served a file outside the lab", p)
		}
	}
	if w := f.do("POST", "/-/now", nil, basic(f.admin), origin("http://dash.example:8080")); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /-/now: HTTP %d", w.Code)
	}
}

func TestLabListsAndServesReports(t *testing.T) {
	f := newFixture(t)
	w := f.do("GET", "/-/lab", nil, basic(f.admin))
	body := w.Body.String()
	if !strings.Contains(body, `href="/-/lab/run1/report.html"`) || !strings.Contains(body, "samples.csv") ||
		strings.Contains(body, "notes.key") || strings.Contains(body, "escape") {
		t.Fatalf("lab page:\n%s", body)
	}
	w = f.do("GET", "/-/lab/run1/report.html", nil, basic(f.admin))
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "secret report") || w.Header().Get("Content-Security-Policy") != reportCSP {
		t.Fatalf("report: HTTP %d, CSP %q", w.Code, w.Header().Get("Content-Security-Policy"))
	}
	w = f.do("GET", "/-/lab/run1/samples.csv", nil, basic(f.admin))
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/csv; charset=utf-8" {
		t.Fatalf("samples: HTTP %d, %q", w.Code, w.Header().Get("Content-Type"))
	}
	// No lab directory yet: a page that says so.
	f.h.LabDir = filepath.Join(t.TempDir(), "none")
	if w := f.do("GET", "/-/lab", nil, basic(f.admin)); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "No lab directory yet") {
		t.Fatalf("missing lab dir: HTTP %d\n%s", w.Code, w.Body.String())
	}
}

func TestCostsWindows(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		query  string
		status int
		want   string
	}{
		{"window=1h", 200, "1.23 s"},
		{"window=7d", 200, "1.23 s"},
		{"window=2h", 400, "unknown window"},
		{"window=custom&from=2026-01-01T00:00&to=2025-01-01T00:00", 400, "must end after it starts"},
		{"window=custom&from=yesterday&to=2025-01-01T00:00", 400, "want a time like"},
		{"window=custom&from=2020-01-01T10:00&to=2020-01-01T12:00", 200, "from 2020-01-01 10:00 UTC to 2020-01-01 12:00 UTC"},
	} {
		w := f.do("GET", "/-/costs?"+tc.query, nil, basic(f.admin))
		if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.want) {
			t.Errorf("%s: HTTP %d, want %d with %q:\n%s", tc.query, w.Code, tc.status, tc.want, w.Body.String())
		}
	}
}

func TestCloneURLs(t *testing.T) {
	h := &Handler{GitAddr: &net.TCPAddr{Port: 9418}, SSHAddr: &net.TCPAddr{Port: 2222}}
	r := httptest.NewRequest("GET", "/-/repos", nil)
	r.Host = "git.example:8080"
	got := h.cloneURLs(r)
	want := []urlBase{{"http", "http://git.example:8080/", ".git"}, {"ssh", "ssh://git@git.example:2222/", ""}, {"git", "git://git.example/", ""}}
	if len(got) != len(want) {
		t.Fatalf("clone URLs %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("clone URL %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	r.Host = "[::1]:8080"
	if u := h.cloneURLs(r)[2].URL; u != "git://[::1]/" {
		t.Errorf("IPv6: %s", u)
	}
}

func TestCountRefsAgreesWithGit(t *testing.T) {
	env := gittest.New(t)
	dir := filepath.Join(t.TempDir(), "r.git")
	env.Build(dir, gittest.Shape{Commits: 5, Files: 3, BlobBytes: 100, Branches: 4, Tags: 3, Seed: 9})
	check := func(when string) {
		t.Helper()
		got, err := countRefs(dir)
		if err != nil {
			t.Fatal(err)
		}
		var want refCount
		for _, ref := range strings.Fields(env.Git(dir, "for-each-ref", "--format=%(refname)")) {
			switch {
			case strings.HasPrefix(ref, "refs/heads/"):
				want.Branches++
			case strings.HasPrefix(ref, "refs/tags/"):
				want.Tags++
			default:
				want.Other++
			}
		}
		if got != want {
			t.Fatalf("%s: counted %+v, git lists %+v", when, got, want)
		}
	}
	check("as built")
	env.Git(dir, "pack-refs", "--all")
	check("packed")
	head := strings.TrimSpace(env.Git(dir, "rev-parse", "main"))
	env.Git(dir, "update-ref", "refs/heads/main", head+"~1") // a loose ref over a packed one
	env.Git(dir, "update-ref", "refs/pull/1/head", head)
	check("packed and loose")
	if _, err := countRefs(filepath.Join(t.TempDir(), "missing")); err != nil {
		t.Fatalf("a directory without refs: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "packed-refs"), []byte("# pack-refs with: peeled\nnot a ref line\n"), 0o644)
	if _, err := countRefs(dir); err == nil || !strings.Contains(err.Error(), "packed-refs line 2") {
		t.Fatalf("a broken packed-refs: %v", err)
	}
}

func FuzzParsePackedRefs(f *testing.F) {
	f.Add([]byte("# pack-refs with: peeled fully-peeled sorted \n" + strings.Repeat("a", 40) + " refs/heads/main\n^" + strings.Repeat("b", 40) + "\n"))
	f.Add([]byte(strings.Repeat("0", 64) + " refs/tags/v1\n"))
	f.Add([]byte("\n\n#\n^\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n := 0
		err := parsePackedRefs(strings.NewReader(string(data)), func(name string) {
			n++
			if !strings.HasPrefix(name, "refs/") || strings.ContainsAny(name, " \t\x00\n") {
				t.Fatalf("accepted ref name %q", name)
			}
		})
		if err == nil && n > strings.Count(string(data), "\n")+1 {
			t.Fatalf("%d refs from %d lines", n, strings.Count(string(data), "\n")+1)
		}
	})
}

// TestNowCountsFetchCacheReplays: with the default configuration (fetch
// cache on, pack cache off) the Now page shows the fetch cache and counts
// its replays as shared.
func TestNowCountsFetchCacheReplays(t *testing.T) {
	f := newFixture(t)
	fc := &fetchcache.Cache{Dir: filepath.Join(t.TempDir(), "fetch"), MaxBytes: 1 << 20, GitVersion: "git version test"}
	if err := fc.Open(); err != nil {
		t.Fatal(err)
	}
	f.h.FetchCache = fc
	ctx := context.Background()
	for _, outcome := range []string{fetchcache.Generated, fetchcache.Replayed, fetchcache.Replayed, fetchcache.Replayed} {
		f.gov.Record(governor.Record{ID: governor.NewID(time.Now()), Start: time.Now(), Transport: "http", Repo: "team/secret",
			Kind: "full-clone", Service: "git-upload-pack", PackCache: outcome, Result: "ok"})
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if recs, _ := f.gov.Last(ctx, 5); len(recs) == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("records not written")
		}
	}
	v := f.h.nowData(ctx)
	if !v.Fetch || v.Cache || v.Fields["fetch-stored"] != "0 (0 B)" || !strings.HasPrefix(v.Fields["fetch-runs"], "0, followed by 0 requests") {
		t.Fatalf("fetch cache fields: fetch %v, pack cache %v, %q, %q", v.Fetch, v.Cache, v.Fields["fetch-stored"], v.Fields["fetch-runs"])
	}
	if got := v.Fields["shared"]; got != "3 of 4 packs (75%)" {
		t.Fatalf("shared: %q, want 3 of 4 packs (75%%)", got)
	}
	// The hour's totals count every record, the fixture's (no cache) too.
	if got := v.Fields["hour-requests"]; got != "5" {
		t.Fatalf("hour-requests: %q, want 5", got)
	}
	if got, want := v.Fields["hour-cpu"], durationText(1234*time.Millisecond); got != want {
		t.Fatalf("hour-cpu: %q, want %q", got, want)
	}
	w := f.do("GET", "/-/now", nil, basic(f.admin))
	if body := w.Body.String(); w.Code != 200 || !strings.Contains(body, `id="fetch-stored"`) || strings.Contains(body, "fetch cache is off") {
		t.Fatalf("Now page: %d\n%s", w.Code, body)
	}
}

// TestClusterPage: on a node, the Cluster page shows nodes and each
// repository's copies, stale and unhealthy ones marked; elsewhere it says
// this server is not a node.
func TestClusterPage(t *testing.T) {
	f := newFixture(t)
	if w := f.do("GET", "/-/cluster", nil, basic(f.admin)); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "not a cluster node") {
		t.Fatalf("single server: HTTP %d\n%s", w.Code, w.Body.String())
	}
	f.h.ClusterStatus = func(context.Context) (cluster.Status, error) {
		return cluster.Status{
			Nodes: []cluster.NodeStatus{{Name: "a", URL: "http://a:8080", Healthy: true, HeartbeatAge: "200ms"}, {Name: "b", URL: "http://b:8080", HeartbeatAge: "9s"}},
			Repos: []cluster.RepoStatus{{Name: "team/app", Primary: "a", Generation: 7, Replicas: []cluster.Replica{{Node: "a", Generation: 7, Healthy: true}, {Node: "b", Generation: 5}}}},
		}, nil
	}
	// Records carry the node that served them: the Cluster page shows
	// each node's last hour, the Costs page a breakdown by node (which a
	// single server's unnamed records do not get).
	if body := f.do("GET", "/-/costs?window=1h", nil, basic(f.admin)).Body.String(); strings.Contains(body, `id="by-node"`) {
		t.Fatalf("the Costs page of unnamed records has a node breakdown:\n%s", body)
	}
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		f.gov.Record(governor.Record{ID: governor.NewID(time.Now()), Start: time.Now(), Transport: "git", Repo: "team/app", Kind: "full-clone",
			Service: "git-upload-pack", Wall: governor.Duration(time.Second), UserCPU: governor.Duration(3 * time.Second), Result: "ok", Node: "b"})
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if recs, _ := f.gov.Last(ctx, 3); len(recs) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the records were not written")
		}
	}
	body := f.do("GET", "/-/cluster", nil, basic(f.admin)).Body.String()
	for _, want := range []string{"http://a:8080", "<strong>no</strong>", "team/app", "a: 7", "b: 5 <strong>stale</strong> <strong>unhealthy</strong>",
		`<td class="n">2</td><td class="n">` + durationText(6*time.Second) + `</td></tr>`} {
		if !strings.Contains(body, want) {
			t.Errorf("the Cluster page lacks %q:\n%s", want, body)
		}
	}
	body = f.do("GET", "/-/costs?window=1h", nil, basic(f.admin)).Body.String()
	if !strings.Contains(body, `id="by-node"`) || !strings.Contains(body, "<td>b</td>") {
		t.Errorf("the Costs page has no breakdown by node:\n%s", body)
	}
	if body := f.do("GET", "/-/now", nil, basic(f.admin)).Body.String(); !strings.Contains(body, "every node of the cluster") {
		t.Errorf("the Now page does not say its last hour is the cluster's:\n%s", body)
	}
}

// TestCostsChartUnits: the Costs page's charts read in units people use:
// the fixture's 1.23 s of CPU in a day or a week is µs or ms of CPU a
// second (it was "5e-05" cores), requests an hour or a minute, and the time axis
// over an hour to three months is ticked at round times (it was 10:00:00, 15:33:20, 21:06:40).
func TestCostsChartUnits(t *testing.T) {
	f := newFixture(t)
	scientific := regexp.MustCompile(`>[^<]*\d[eE][-+]?\d[^<]*</text>`)
	seconds := regexp.MustCompile(`>\d\d:\d\d:\d\d</text>`)
	month := "window=custom&from=" + time.Now().UTC().AddDate(0, -3, 0).Format("2006-01-02T15:04") + "&to=" + time.Now().UTC().Add(time.Hour).Format("2006-01-02T15:04")
	for _, window := range []string{"window=1h", "window=24h", "window=7d", month} {
		body := f.do("GET", "/-/costs?"+window, nil, basic(f.admin)).Body.String()
		if m := scientific.FindString(body); m != "" {
			t.Errorf("%s: a chart prints %q", window, m)
		}
		if m := seconds.FindString(body); m != "" && window != "window=1h" {
			t.Errorf("%s: the time axis is ticked at %q, not on a round time", window, m)
		}
		if !strings.Contains(body, "s/s</text>") || !regexp.MustCompile(`req/(h|min)</text>`).MatchString(body) {
			t.Errorf("%s: the charts lack CPU a second or requests a minute:\n%s", window, body)
		}
	}
}

// With LFS on, the Repositories page shows each repository's LFS objects,
// their bytes and its locks.
func TestReposPageShowsLFS(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	index, err := lfs.OpenIndex(ctx, filepath.Join(t.TempDir(), lfs.IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	defer index.Close()
	for i, size := range []int64{3 << 20, 1 << 20} {
		if err := index.Add(ctx, "team/secret", fmt.Sprintf("%064x", i+1), size); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := index.CreateLock(ctx, "team/secret", "art/hero.psd", "alice"); err != nil {
		t.Fatal(err)
	}
	f.h.LFS = index
	body := f.do("GET", "/-/repos", nil, basic(f.admin)).Body.String()
	for _, want := range []string{"2 objects, 4.0 MiB", "<code>art/hero.psd</code>", "locked by alice"} {
		if !strings.Contains(body, want) {
			t.Errorf("repos page lacks %q:\n%s", want, body)
		}
	}
}
