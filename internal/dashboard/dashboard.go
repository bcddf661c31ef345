// Package dashboard is packwire's web dashboard under /-/ on the HTTP
// listener: what the server is doing now (requests in flight, the
// limiter's queues, pack sharing), what requests cost over a window, the
// repositories with their layout health and clone URLs, and the lab's
// reports. Pages are rendered on the server from embedded templates with
// inline SVG charts (internal/chart); the only script is a small embedded
// file that refreshes the Now page and copies clone URLs. Every page but
// the login form needs a server admin: a session opened with an admin's
// token, or the token itself over HTTP Basic.
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"packwire/internal/access"
	"packwire/internal/fetchcache"
	"packwire/internal/governor"
	"packwire/internal/lfs"
	"packwire/internal/packcache"
	"packwire/internal/pipeline"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
)

// Prefix is where the dashboard lives on the HTTP listener. No repository
// name may start with "-", so it can never shadow a repository.
const Prefix = "/-/"

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Handler serves the dashboard. Access and Repos are required; a nil
// Pipeline, Governor, FetchCache or PackCache shows that part as unavailable.
type Handler struct {
	Access     *access.Controller
	Pipeline   *pipeline.Pipeline
	Governor   *governor.Governor
	FetchCache *fetchcache.Cache
	PackCache  *packcache.Cache
	Repos      repo.Root
	// LabDir holds the lab's reports, one directory per run with report.html.
	LabDir string
	// GitAddr and SSHAddr are the listeners clone URLs name (nil: off).
	GitAddr, SSHAddr net.Addr
	// ClusterStatus, if set (a cluster node), reads the cluster's nodes and
	// repositories for the Cluster page.
	ClusterStatus func(context.Context) (cluster.Status, error)
	// LFS, if set, is the LFS index: each repository's objects, bytes and
	// locks on the Repositories page.
	LFS *lfs.Index
	// SessionTTL is how long a login lasts (default 12h).
	SessionTTL time.Duration
	Log        *slog.Logger

	once     sync.Once
	pages    map[string]*template.Template
	sessions sessions
}

const (
	// Pages: no inline script or style, nothing from elsewhere, never in a frame.
	pageCSP = "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
	// Lab reports are self-contained HTML with inline CSS and SVG: no
	// scripts, no requests, and a sandbox so they cannot act as the dashboard.
	reportCSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; sandbox"
)

func (h *Handler) init() {
	h.once.Do(func() {
		funcs := template.FuncMap{
			"bytes": bytesText, "dur": durationText, "ago": agoText, "utc": utcText, "kind": kindText,
			"user": userText, "pct": percentText, "add": func(a, b int) int { return a + b },
		}
		h.pages = map[string]*template.Template{}
		for _, page := range []string{"login", "now", "costs", "repos", "lab", "audit", "cluster", "error"} {
			h.pages[page] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", "templates/"+page+".html"))
		}
		if h.SessionTTL <= 0 {
			h.SessionTTL = 12 * time.Hour
		}
	})
}

func (h *Handler) log() *slog.Logger {
	if h.Log == nil {
		return slog.Default()
	}
	return h.Log
}

// ServeHTTP routes exactly: any path it does not know is a 404, whatever
// its shape, and nothing but the login form and its stylesheet is served
// without an admin.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.init()
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", pageCSP)
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "same-origin")
	hdr.Set("Cache-Control", "no-store")

	path, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok || len(r.URL.RawQuery) > 2048 {
		h.notFound(w, r)
		return
	}
	if r.Method == http.MethodPost && !sameOrigin(r) {
		// Forms are only ever posted by the dashboard's own pages.
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
		return
	}
	switch path {
	case "static/style.css", "static/app.js":
		h.static(w, r, path)
		return
	case "login":
		h.login(w, r)
		return
	}
	who, ok := h.authenticate(w, r)
	if !ok {
		return
	}
	get := r.Method == http.MethodGet || r.Method == http.MethodHead
	switch {
	case path == "" && get:
		http.Redirect(w, r, Prefix+"now", http.StatusSeeOther)
	case path == "logout" && r.Method == http.MethodPost:
		h.logout(w, r)
	case path == "now" && get:
		h.now(w, r, who)
	case path == "now.json" && get:
		h.nowJSON(w, r)
	case path == "costs" && get:
		h.costs(w, r, who)
	case path == "repos" && get:
		h.repos(w, r, who)
	case path == "lab" && get:
		h.lab(w, r, who)
	case path == "audit" && get:
		h.audit(w, r, who)
	case path == "cluster" && get:
		h.cluster(w, r, who)
	case strings.HasPrefix(path, "lab/") && get:
		h.labFile(w, r, strings.TrimPrefix(path, "lab/"))
	case path == "logout" || path == "now" || path == "now.json" || path == "costs" || path == "repos" || path == "lab" || path == "audit" || path == "cluster":
		w.Header().Set("Allow", "GET")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	default:
		h.notFound(w, r)
	}
}

// sameOrigin reports whether a state-changing request comes from a page of
// this server: its Origin (or, lacking that, its Referer) names this host.
// The scheme is not compared: behind a proxy that ends TLS the browser says
// https while the server sees http, and the host is what an attacker's page
// cannot fake.
func sameOrigin(r *http.Request) bool {
	from := r.Header.Get("Origin")
	if from == "" || from == "null" {
		from = r.Header.Get("Referer")
	}
	u, err := url.Parse(from)
	return err == nil && from != "" && (u.Scheme == "http" || u.Scheme == "https") && u.Host == r.Host
}

func (h *Handler) static(w http.ResponseWriter, r *http.Request, path string) {
	b, err := fs.ReadFile(staticFiles, path)
	if err != nil {
		h.notFound(w, r)
		return
	}
	ct := "text/css; charset=utf-8"
	if strings.HasSuffix(path, ".js") {
		ct = "text/javascript; charset=utf-8"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, path, time.Time{}, bytes.NewReader(b))
}

// page is what every template gets.
type page struct {
	Title  string
	Nav    string // which tab is current
	User   string // the admin, empty on the login page
	Status int
	Data   any
}

func (h *Handler) render(w http.ResponseWriter, name string, p page) {
	var buf bytes.Buffer
	if err := h.pages[name].Execute(&buf, p); err != nil {
		h.log().Error("dashboard: rendering", "page", name, "error", err.Error())
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if p.Status != 0 {
		w.WriteHeader(p.Status)
	}
	w.Write(buf.Bytes())
}

func (h *Handler) notFound(w http.ResponseWriter, r *http.Request) {
	h.render(w, "error", page{Title: "Not found", Status: http.StatusNotFound, Data: "There is no such page."})
}

func (h *Handler) fail(w http.ResponseWriter, who string, status int, msg string, err error) {
	if err != nil {
		h.log().Error("dashboard", "error", err.Error(), "shown", msg)
	}
	h.render(w, "error", page{Title: "Error", User: who, Status: status, Data: msg})
}
