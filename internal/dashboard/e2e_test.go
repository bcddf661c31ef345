package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/dashboard"
	"packwire/internal/gittest"
	"packwire/internal/pipeline"
	"packwire/internal/server"
	"packwire/internal/servertest"
)

type e2eServer struct {
	*server.Server
	env        *gittest.Env
	admin      string // root's token: admin on **
	writer     string // alice's token: write on **, not an admin
	base       string // http://127.0.0.1:port
	git        string // git://127.0.0.1:port
	labDir     string
	reportBody string
}

func startE2E(t *testing.T) *e2eServer {
	t.Helper()
	labDir := filepath.Join(t.TempDir(), "lab")
	ts := servertest.Start(t, func(cfg *server.Config) {
		cfg.SSHAddr = "" // the Repos page then offers two clone URLs per repository
		cfg.RecordsFlush = 20 * time.Millisecond
		cfg.PackCache = true
		cfg.PackCacheMinFreeBytes = 0
		cfg.LabDir = labDir
	})
	srv := ts.Server
	s := &e2eServer{Server: srv, env: ts.Env, base: "http://" + srv.HTTPAddr.String(), git: "git://" + srv.GitAddr.String(), labDir: labDir,
		admin: ts.Token(t, "root", "admin"), writer: ts.Token(t, "alice", "write")}
	// A lab run as packwire bench leaves it: a self-contained report with
	// inline CSS and SVG, and its samples.
	run := filepath.Join(labDir, "2026-11-21-clone-matrix")
	os.MkdirAll(run, 0o755)
	s.reportBody = "Full clone: 2.1 s median over 5 runs"
	os.WriteFile(filepath.Join(run, dashboard.ReportFile), []byte(`<!doctype html><html><head><meta charset="utf-8"><title>clone matrix</title>
<style>body{font-family:sans-serif;margin:2em} h1{color:#0072b2}</style></head><body><h1>Lab report: clone matrix</h1>
<p>`+s.reportBody+`</p><svg xmlns="http://www.w3.org/2000/svg" width="300" height="60"><rect x="0" y="10" width="210" height="30" fill="#0072b2"/>
<text x="220" y="30">2.1 s</text></svg></body></html>`), 0o644)
	os.WriteFile(filepath.Join(run, "samples.json"), []byte(`[{"scenario":"T1","wall_s":2.1}]`), 0o644)
	return s
}

// screenshotDir is where the pages' PNGs go: $PACKWIRE_SCREENSHOTS, or one
// fixed directory under the system's temporary directory, replaced each run.
func screenshotDir(t *testing.T) string {
	dir := os.Getenv("PACKWIRE_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "packwire-dashboard-screenshots")
		os.RemoveAll(dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDashboardInChromium starts a server, makes traffic (one clone held in
// flight by a slow network), and loads every page in headless Chromium:
// without an admin token only the login form, with one each page shows the
// live and recorded requests, no console errors, no request off 127.0.0.1.
func TestDashboardInChromium(t *testing.T) {
	b := startBrowser(t)
	s := startE2E(t)
	shots := screenshotDir(t)
	t.Logf("screenshots in %s", shots)
	ctx := context.Background()

	// Traffic: a small repository cloned and fetched over both transports
	// and pushed to, and a big one whose clone crawls through a slow proxy.
	app := s.Data.Repos.PathFor("team/app")
	os.MkdirAll(filepath.Dir(app), 0o755)
	s.env.Build(app, gittest.Shape{Commits: 20, Files: 30, BlobBytes: 2000, Branches: 3, Tags: 2, Seed: 1})
	big := s.Data.Repos.PathFor("team/big")
	s.env.Build(big, gittest.Shape{Commits: 2, Files: 6, BlobBytes: 1 << 20, Incompress: true, Seed: 2})
	work := t.TempDir()
	s.env.Git("", "clone", "-q", s.git+"/team/app", filepath.Join(work, "a1"))
	s.env.Git("", "clone", "-q", s.git+"/team/app", filepath.Join(work, "a2"))
	s.env.Git("", "clone", "-q", "--depth", "1", s.base+"/team/app.git", filepath.Join(work, "a3"))
	s.env.Git(filepath.Join(work, "a1"), "commit", "-q", "--allow-empty", "-m", "more")
	pushURL := strings.Replace(s.base, "http://", "http://alice:"+s.writer+"@", 1) + "/team/app.git"
	s.env.Git(filepath.Join(work, "a1"), "push", "-q", pushURL, "HEAD:main")
	s.env.Git(filepath.Join(work, "a2"), "fetch", "-q", "origin")

	proxy := gittest.NewSlowProxy(t, s.GitAddr.String(), 96<<10)
	slow := exec.Command("git", "clone", "-q", "git://"+proxy.Addr+"/team/big", filepath.Join(work, "big"))
	slow.Env = s.env.Vars
	var slowOut strings.Builder
	slow.Stdout, slow.Stderr = &slowOut, &slowOut
	if err := slow.Start(); err != nil {
		t.Fatal(err)
	}
	slowDone := make(chan error, 1)
	go func() { slowDone <- slow.Wait() }()
	t.Cleanup(func() { proxy.Release(); <-slowDone })
	var inFlight pipeline.Active
	for deadline := time.Now().Add(20 * time.Second); inFlight.BytesOut == 0; time.Sleep(20 * time.Millisecond) {
		for _, a := range s.Pipeline.Active() {
			if a.Repo == "team/big" && a.Kind == "full-clone" && a.BytesOut > 0 {
				inFlight = a
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slow clone never showed in Pipeline.Active: %+v (git: %s)", s.Pipeline.Active(), slowOut.String())
		}
	}

	// Without an admin: the login form and nothing else, whatever the page.
	anon := b.newTab()
	anonStart := anon.mark()
	for _, page := range []string{"/-/now", "/-/costs?window=1h", "/-/repos", "/-/lab", "/-/lab/2026-11-21-clone-matrix/report.html"} {
		if status := anon.navigate(s.base + page); status != 401 {
			t.Fatalf("%s without a session: HTTP %d, want 401", page, status)
		}
		text := anon.text()
		if !strings.Contains(text, "Log in") || strings.Contains(text, "team/") || strings.Contains(text, inFlight.RecordID) || strings.Contains(text, s.reportBody) {
			t.Fatalf("%s without a session shows more than the login form:\n%s", page, text)
		}
	}
	var jsonStatus int
	anon.eval(`fetch("/-/now.json").then(r => r.status)`, &jsonStatus)
	if jsonStatus != 401 {
		t.Fatalf("now.json without a session: HTTP %d", jsonStatus)
	}
	// A valid token that is not a server admin's opens nothing.
	anon.navigate(s.base + "/-/login")
	since := anon.mark()
	anon.eval(fmt.Sprintf(`document.getElementById("token").value = %q; document.querySelector("form[action='/-/login']").submit(); true`, s.writer), nil)
	anon.waitLoad(since)
	if text := anon.text(); !strings.Contains(text, "not the token of a server admin") || strings.Contains(text, "team/") {
		t.Fatalf("alice's (write) token at the login form:\n%s", text)
	}
	anon.screenshot(filepath.Join(shots, "login.png"))
	for _, p := range anon.problems(anonStart) {
		// The refusals are 401 answers by design; Chromium logs each.
		if !strings.Contains(p, "status of 401") {
			t.Errorf("without a session: %s", p)
		}
	}

	// The admin logs in with the form: the cookie carries a session id, never the token.
	tb := b.newTab()
	start := tb.mark()
	if status := tb.navigate(s.base + "/-/login"); status != 401 && status != 200 {
		t.Fatalf("login page: HTTP %d", status)
	}
	since = tb.mark()
	tb.eval(fmt.Sprintf(`document.getElementById("token").value = %q; document.querySelector("form[action='/-/login']").submit(); true`, s.admin), nil)
	tb.waitLoad(since)
	var loc string
	tb.eval("location.pathname", &loc)
	if loc != "/-/now" {
		t.Fatalf("after logging in: at %s:\n%s", loc, tb.text())
	}
	var cookies struct {
		Cookies []struct {
			Name, Value, SameSite string
			HTTPOnly              bool `json:"httpOnly"`
		}
	}
	json.Unmarshal(b.must(tb.session, "Network.getCookies", nil), &cookies)
	if len(cookies.Cookies) != 1 || !cookies.Cookies[0].HTTPOnly || cookies.Cookies[0].SameSite != "Strict" ||
		strings.Contains(cookies.Cookies[0].Value, strings.TrimPrefix(s.admin, "pwt_")[:16]) {
		t.Fatalf("session cookie: %+v", cookies.Cookies)
	}

	// Now: the running clone, with its record id, kind and bytes so far;
	// the page's script keeps it current.
	text := tb.text()
	for _, want := range []string{inFlight.RecordID, "team/big", "full-clone", "git", "Pack sharing"} {
		if !strings.Contains(text, want) {
			t.Fatalf("Now page lacks %q:\n%s", want, text)
		}
	}
	var first, later string
	tb.eval(`document.getElementById("updated").textContent`, &first)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		tb.eval(`document.getElementById("updated").textContent`, &later)
		if later != first || time.Now().After(deadline) {
			break
		}
	}
	if later == first {
		t.Fatalf("the Now page did not refresh itself in 10 s (still %q)", first)
	}
	var row string
	tb.eval(`[...document.querySelectorAll("#active tbody tr")].map(r => r.innerText).join("\n")`, &row)
	if !strings.Contains(row, inFlight.RecordID) || !strings.Contains(row, "team/big") {
		t.Fatalf("after a refresh the running clone is gone from the table:\n%s", row)
	}
	tb.screenshot(filepath.Join(shots, "now.png"))

	// The clone finishes; its record reaches the governor.
	proxy.Release()
	select {
	case err := <-slowDone:
		slowDone <- err
		if err != nil {
			t.Fatalf("slow clone: %v\n%s", err, slowOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the slow clone did not finish in 30 s after the proxy let go")
	}
	var bigCPU time.Duration
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		recs, err := s.Governor.Last(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		bigCPU = 0
		for _, r := range recs {
			if r.Repo == "team/big" {
				bigCPU += r.CPU()
				found = found || r.ID == inFlight.RecordID
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow clone's record never reached the governor")
		}
	}
	if bigCPU <= 0 {
		t.Fatal("the slow clone's record has no git CPU")
	}
	for _, a := range s.Pipeline.Active() {
		if a.ID == inFlight.ID {
			t.Fatalf("the finished clone is still in Pipeline.Active: %+v", a)
		}
	}

	// Costs: the clone's CPU in the by-repo table, from the records' own sum.
	if status := tb.navigate(s.base + "/-/costs?window=1h"); status != 200 {
		t.Fatalf("costs: HTTP %d", status)
	}
	var cpuCell string
	tb.eval(`(() => { for (const r of document.querySelectorAll("#by-repo tbody tr")) { if (r.cells[0].innerText === "team/big") return r.querySelector("td.cpu").innerText; } return ""; })()`, &cpuCell)
	if want := dashboard.DurationText(bigCPU); cpuCell != want {
		t.Fatalf("Costs shows %q as team/big's git CPU, the records add up to %s (%s)", cpuCell, want, bigCPU)
	}
	if text := tb.text(); !strings.Contains(text, "full-clone") || !strings.Contains(text, "p95 wall") {
		t.Fatalf("costs page:\n%s", text)
	}
	var svgs int
	tb.eval(`document.querySelectorAll("figure svg").length`, &svgs)
	if svgs < 6 {
		t.Fatalf("costs page has %d charts, want the 2 time series and 4 breakdowns", svgs)
	}
	tb.screenshot(filepath.Join(shots, "costs.png"))

	// Repos: both repositories, refs as git counts them, the push, clone
	// URLs, and the layout: team/app maintained (ok), team/big not.
	appRepo, err := s.Data.Repos.Resolve("team/app")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Maintainer.Maintain(ctx, appRepo, true); err != nil {
		t.Fatal(err)
	}
	tb.navigate(s.base + "/-/repos")
	text = tb.text()
	refs := len(strings.Fields(s.env.Git(app, "for-each-ref", "--format=%(refname)")))
	for _, want := range []string{"team/app", "team/big", s.git + "/team/app", s.base + "/team/app.git", fmt.Sprintf("%d\n", refs), "full-clone"} {
		if !strings.Contains(text, want) {
			t.Fatalf("Repos page lacks %q:\n%s", want, text)
		}
	}
	var lastPush, appLayout, bigLayout string
	tb.eval(`document.getElementById("repo-team/app").cells[3].innerText`, &lastPush)
	if strings.Contains(lastPush, "none") || !strings.Contains(lastPush, "UTC") {
		t.Fatalf("team/app's last push: %q", lastPush)
	}
	tb.eval(`document.getElementById("repo-team/app").cells[4].innerText`, &appLayout)
	tb.eval(`document.getElementById("repo-team/big").cells[4].innerText`, &bigLayout)
	if !strings.HasPrefix(appLayout, "ok") || !strings.Contains(appLayout, "full, ok") || !strings.Contains(bigLayout, "no preferred pack") {
		t.Fatalf("layouts: team/app %q, team/big %q", appLayout, bigLayout)
	}
	var copyButtons int
	tb.eval(`[...document.querySelectorAll("button.copy")].filter(b => !b.hidden).length`, &copyButtons)
	if copyButtons != 4 {
		t.Fatalf("%d copy buttons shown, want 2 per repository", copyButtons)
	}
	tb.screenshot(filepath.Join(shots, "repos.png"))

	// Lab: the run is listed and its report opens in place, under the strict CSP.
	tb.navigate(s.base + "/-/lab")
	if text := tb.text(); !strings.Contains(text, "2026-11-21-clone-matrix") || !strings.Contains(text, "samples.json") {
		t.Fatalf("lab page:\n%s", text)
	}
	tb.screenshot(filepath.Join(shots, "lab.png"))
	since = tb.mark()
	tb.eval(`document.querySelector("a[href$='report.html']").click(); true`, nil)
	tb.waitLoad(since)
	if text := tb.text(); !strings.Contains(text, s.reportBody) {
		t.Fatalf("lab report:\n%s", text)
	}
	evs, _ := tb.eventsSince(since)
	csp := ""
	for _, e := range evs {
		var p struct {
			Type     string
			Response struct{ Headers map[string]string }
		}
		if e.Method == "Network.responseReceived" && json.Unmarshal(e.Params, &p) == nil && p.Type == "Document" {
			csp = p.Response.Headers["Content-Security-Policy"]
		}
	}
	if !strings.Contains(csp, "sandbox") || !strings.Contains(csp, "default-src 'none'") {
		t.Fatalf("lab report served with CSP %q", csp)
	}
	tb.screenshot(filepath.Join(shots, "lab-report.png"))

	// Logging out ends the session.
	tb.navigate(s.base + "/-/now")
	since = tb.mark()
	tb.eval(`document.querySelector("form.logout").submit(); true`, nil)
	tb.waitLoad(since)
	if status := tb.navigate(s.base + "/-/now"); status != 401 || strings.Contains(tb.text(), "team/") {
		t.Fatalf("after logging out: HTTP %d\n%s", status, tb.text())
	}
	for _, p := range tb.problems(start) {
		if !strings.Contains(p, "status of 401") {
			t.Errorf("admin's pages: %s", p)
		}
	}

	// Chromium's own net log: every connection it opened went to 127.0.0.1.
	b.close()
	nl, err := b.readNetLog()
	if err != nil {
		t.Fatal(err)
	}
	if len(nl.Connected) == 0 {
		t.Fatalf("the net log holds no connection at all (%d URLs): it proves nothing", len(nl.URLs))
	}
	for _, a := range nl.Connected {
		if !strings.HasPrefix(a, "127.0.0.1:") {
			t.Errorf("Chromium connected to %s", a)
		}
	}
	if nl.UDPSends != 0 {
		t.Errorf("Chromium sent %d UDP datagrams", nl.UDPSends)
	}
	own := map[string]bool{}
	for _, u := range nl.URLs {
		if !localURL(u) {
			host, _, _ := strings.Cut(strings.SplitN(u, "://", 2)[len(strings.SplitN(u, "://", 2))-1], "/")
			own[host] = true
		}
	}
	t.Logf("net log: %d connections, all to 127.0.0.1; %d URLs; Chromium's own services asked for %v and could not resolve them", len(nl.Connected), len(nl.URLs), own)
}
