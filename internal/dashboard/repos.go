package dashboard

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"packwire/internal/governor"
	"packwire/internal/lfs"
	"packwire/internal/maintain"
	"packwire/internal/server/cluster"
	"packwire/internal/transport/forwarded"
)

// mixWindow is how far back the request mix per repository looks.
const mixWindow = 7 * 24 * time.Hour

type reposView struct {
	Repos      []repoRow
	MixWindow  string
	PushSource string
	Deliveries []deliveryRow // the newest webhook and push mirror deliveries
}

type repoRow struct {
	Name        string
	Size        int64 // packs (with indexes) on disk
	Loose       int
	Packs       int
	Refs        refCount
	RefsErr     string
	LastPush    time.Time
	Health      string // "ok" or what maintenance would do and why
	Healthy     bool
	Maintained  *governor.MaintenanceRun
	Mix         []governor.CostGroup // by kind, most requests first
	MixRequests int64
	URLs        []cloneURL
	LFS         *lfsUsage // nil: LFS off
}

// lfsUsage is a repository's LFS objects and locks (the first
// lfsLocksShown of them).
type lfsUsage struct {
	Objects, Bytes int64
	Locks          []lfs.Lock
	MoreLocks      bool
	Err            string
}

const lfsLocksShown = 5

type cloneURL struct {
	Transport, URL string
}

func (h *Handler) repos(w http.ResponseWriter, r *http.Request, who string) {
	ctx := r.Context()
	list, err := h.Repos.List()
	if err != nil {
		h.fail(w, who, http.StatusInternalServerError, "listing repositories failed", err)
		return
	}
	v := reposView{MixWindow: "7 days", PushSource: "governor push records"}
	var pushes map[string]time.Time
	mix := map[string][]governor.CostGroup{}
	if h.Governor != nil {
		if pushes, err = h.Governor.LastPushes(ctx); err != nil {
			h.fail(w, who, http.StatusInternalServerError, "reading push records failed", err)
			return
		}
		now := time.Now()
		b, err := h.Governor.Breakdown(ctx, "repo_kind", now.Add(-mixWindow), now, 0)
		if err != nil {
			h.fail(w, who, http.StatusInternalServerError, "reading the request mix failed", err)
			return
		}
		for _, g := range b.Groups {
			mix[g.Key] = append(mix[g.Key], g)
		}
	}
	var maintained map[string]governor.MaintenanceRun
	if h.Governor != nil {
		maintained, _ = h.Governor.LatestMaintenance(ctx) // none shown if it fails
	}
	urls := h.cloneURLs(r)
	for _, rp := range list {
		row := repoRow{Name: rp.Name, LastPush: pushes[rp.Name], Mix: mix[rp.Name]}
		sort.SliceStable(row.Mix, func(i, j int) bool { return row.Mix[i].Requests > row.Mix[j].Requests })
		for _, g := range row.Mix {
			row.MixRequests += g.Requests
		}
		if l, err := maintain.Inspect(rp.Path); err == nil {
			row.Size, row.Loose, row.Packs = l.Bytes(), l.Loose, len(l.Packs)
			kind, reason := l.Health(0)
			row.Healthy = kind == maintain.None
			row.Health = "ok"
			if !row.Healthy {
				row.Health = fmt.Sprintf("needs a %s run: %s", kind, reason)
			}
		} else {
			row.Health = "cannot read the layout: " + err.Error()
		}
		if row.Refs, err = countRefs(rp.Path); err != nil {
			row.RefsErr = err.Error()
		}
		if run, ok := maintained[rp.Name]; ok {
			row.Maintained = &run
		}
		if h.LFS != nil {
			row.LFS = h.lfsUsage(r.Context(), rp.Name)
		}
		for _, u := range urls {
			row.URLs = append(row.URLs, cloneURL{Transport: u.Transport, URL: u.URL + rp.Name + u.Suffix})
		}
		v.Repos = append(v.Repos, row)
	}
	v.Deliveries = h.deliveries(ctx)
	h.render(w, "repos", page{Title: "Repositories", Nav: "repos", User: who, Data: v})
}

func (h *Handler) lfsUsage(ctx context.Context, name string) *lfsUsage {
	u := &lfsUsage{}
	var err error
	if u.Objects, u.Bytes, err = h.LFS.Usage(ctx, name); err == nil {
		u.Locks, err = h.LFS.Locks(ctx, name, lfs.LockFilter{Limit: lfsLocksShown + 1})
	}
	if err != nil {
		u.Err = "cannot read the LFS index: " + err.Error()
	}
	if len(u.Locks) > lfsLocksShown {
		u.Locks, u.MoreLocks = u.Locks[:lfsLocksShown], true
	}
	return u
}

type urlBase struct {
	Transport, URL, Suffix string
}

// cloneURLs are the URL prefixes of each transport that is on, named by the
// host the admin reached the dashboard at (the Host header) and each
// listener's port, default ports left out.
func (h *Handler) cloneURLs(r *http.Request) []urlBase {
	host := r.Host
	if hh, _, err := net.SplitHostPort(r.Host); err == nil {
		host = hh
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]" // IPv6
	}
	hostPort := func(addr net.Addr, def int) string {
		port := def
		if ta, ok := addr.(*net.TCPAddr); ok {
			port = ta.Port
		} else if _, p, err := net.SplitHostPort(addr.String()); err == nil {
			port, _ = strconv.Atoi(p)
		}
		if port == def {
			return host
		}
		return host + ":" + strconv.Itoa(port)
	}
	var out []urlBase
	scheme := forwarded.Scheme(r) // https behind a TLS proxy too
	out = append(out, urlBase{Transport: scheme, URL: scheme + "://" + r.Host + "/", Suffix: ".git"})
	if h.SSHAddr != nil {
		out = append(out, urlBase{Transport: "ssh", URL: "ssh://git@" + hostPort(h.SSHAddr, 22) + "/"})
	}
	if h.GitAddr != nil {
		out = append(out, urlBase{Transport: "git", URL: "git://" + hostPort(h.GitAddr, 9418) + "/"})
	}
	return out
}

// audit shows the latest changes of the audit log.
func (h *Handler) audit(w http.ResponseWriter, r *http.Request, who string) {
	entries, err := h.Access.Store.Audit(r.Context(), 200)
	if err != nil {
		h.fail(w, who, http.StatusInternalServerError, "reading the audit log failed", err)
		return
	}
	h.render(w, "audit", page{Title: "Audit log", Nav: "audit", User: who, Data: entries})
}

// clusterView is the Cluster page: the nodes and placements, and what each
// node served in the last hour (the governor's records carry the node, and
// a cluster keeps them all in PostgreSQL).
type clusterView struct {
	*cluster.Status
	Hour map[string]governor.CostGroup // by node name
}

// cluster shows the cluster's nodes and each repository's copies.
func (h *Handler) cluster(w http.ResponseWriter, r *http.Request, who string) {
	var v *clusterView
	if h.ClusterStatus != nil {
		s, err := h.ClusterStatus(r.Context())
		if err != nil {
			h.fail(w, who, http.StatusInternalServerError, "reading the cluster's state failed", err)
			return
		}
		v = &clusterView{Status: &s, Hour: map[string]governor.CostGroup{}}
		if h.Governor != nil {
			now := time.Now()
			if b, err := h.Governor.Breakdown(r.Context(), "node", now.Add(-time.Hour), now, 0); err == nil {
				for _, g := range b.Groups {
					v.Hour[g.Key] = g
				}
			}
		}
	}
	h.render(w, "cluster", page{Title: "Cluster", Nav: "cluster", User: who, Data: v})
}
