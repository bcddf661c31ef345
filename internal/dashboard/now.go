package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"packwire/internal/fetchcache"
	"packwire/internal/packcache"
)

// nowView is the Now page and its JSON: the same data, already formatted,
// so that the page's script only copies text into place.
type nowView struct {
	Time     string            `json:"time"`
	Fields   map[string]string `json:"fields"` // element id -> text
	Active   []activeRow       `json:"active"`
	Queues   []queueRow        `json:"queues"`
	Outcomes []outcomeRow      `json:"outcomes"`
	Limits   bool              `json:"limits"`      // a limiter is configured
	Cache    bool              `json:"cache"`       // the pack cache is on
	Fetch    bool              `json:"fetch_cache"` // the fetch cache is on
	// Cluster: the last hour's figures are every node's (the records
	// are shared in PostgreSQL); in flight, queues and caches are this node's.
	Cluster bool `json:"cluster"`
}

type activeRow struct {
	ID        string `json:"id"`
	Repo      string `json:"repo"`
	User      string `json:"user"`
	Kind      string `json:"kind"`
	Transport string `json:"transport"`
	BytesIn   string `json:"bytes_in"`
	BytesOut  string `json:"bytes_out"`
	Age       string `json:"age"`
	// Raw figures for scripts and tests.
	BytesOutN int64   `json:"bytes_out_n"`
	AgeS      float64 `json:"age_s"`
}

type queueRow struct {
	Repo    string `json:"repo"`
	Running int    `json:"running"`
	Queued  int    `json:"queued"`
}

type outcomeRow struct {
	Outcome  string `json:"outcome"`
	Requests int64  `json:"requests"`
	Share    string `json:"share"`
}

func (h *Handler) nowData(ctx context.Context) nowView {
	now := time.Now()
	v := nowView{Time: now.UTC().Format(time.RFC3339), Fields: map[string]string{}, Cluster: h.ClusterStatus != nil}
	if h.Pipeline != nil {
		for _, a := range h.Pipeline.Active() {
			age := now.Sub(a.Started)
			v.Active = append(v.Active, activeRow{ID: a.RecordID, Repo: a.Repo, User: userText(a.User), Kind: kindText(a.Kind),
				Transport: a.Transport, BytesIn: bytesText(a.BytesIn), BytesOut: bytesText(a.BytesOut),
				Age: durationText(age.Round(100 * time.Millisecond)), BytesOutN: a.BytesOut, AgeS: age.Seconds()})
		}
		if l := h.Pipeline.Limiter; l != nil {
			u := l.Usage()
			v.Limits = true
			v.Fields["pack-jobs"] = fmt.Sprintf("%d of %s", u.Running, limitText(u.Global))
			v.Fields["queued"] = fmt.Sprintf("%d of %s", u.Queued, limitText(u.MaxQueue))
			v.Fields["per-repo"] = limitText(u.PerRepo)
			v.Fields["admitted"] = strconv.FormatInt(u.Admitted, 10)
			for _, r := range u.Repos {
				v.Queues = append(v.Queues, queueRow{Repo: r.Repo, Running: r.Running, Queued: r.Queued})
			}
		}
	}
	v.Fields["in-flight"] = strconv.Itoa(len(v.Active))
	v.Fields["updated"] = now.UTC().Format("15:04:05 UTC")
	if h.FetchCache != nil {
		st := h.FetchCache.Stats()
		v.Fetch = true
		v.Fields["fetch-stored"] = fmt.Sprintf("%d (%s)", st.Entries, bytesText(st.Bytes))
		v.Fields["fetch-runs"] = fmt.Sprintf("%d, followed by %d requests (%s so far)", st.Runs, st.Readers, bytesText(st.RunBytes))
	}
	if h.PackCache != nil {
		packs, size, runs := h.PackCache.Stats()
		v.Cache = true
		v.Fields["cache-packs"] = fmt.Sprintf("%d (%s)", packs, bytesText(size))
		v.Fields["cache-runs"] = strconv.Itoa(runs)
	}
	if h.Governor != nil {
		// One query: every record is in exactly one pack_cache group (""
		// when no cache took part), so the groups add up to the hour's totals.
		if b, err := h.Governor.Breakdown(ctx, "pack_cache", now.Add(-time.Hour), now, 0); err == nil {
			var requests, errs, bytesOut, packs, shared int64
			var cpu time.Duration
			for _, g := range b.Groups {
				requests, errs, bytesOut, cpu = requests+g.Requests, errs+g.Errors, bytesOut+g.BytesOut, cpu+g.CPU
				if g.Key == "" {
					continue
				}
				packs += g.Requests
				if sharedOutcomes[g.Key] {
					shared += g.Requests
				}
				v.Outcomes = append(v.Outcomes, outcomeRow{Outcome: g.Key, Requests: g.Requests})
			}
			for i := range v.Outcomes {
				v.Outcomes[i].Share = percentText(v.Outcomes[i].Requests, packs)
			}
			if requests > 0 {
				v.Fields["hour-requests"] = strconv.FormatInt(requests, 10)
				v.Fields["hour-cpu"] = durationText(cpu)
				v.Fields["hour-errors"] = strconv.FormatInt(errs, 10)
				v.Fields["hour-bytes"] = bytesText(bytesOut)
			}
			v.Fields["shared"] = fmt.Sprintf("%d of %d packs (%s)", shared, packs, percentText(shared, packs))
		}
	}
	for _, k := range []string{"hour-requests", "hour-cpu", "hour-errors", "hour-bytes", "shared"} {
		if _, ok := v.Fields[k]; !ok {
			v.Fields[k] = "-"
		}
	}
	return v
}

// sharedOutcomes are the governor's pack_cache outcomes of a request that
// spent no pack generation of its own: it joined a pack cache run or hit a
// finished pack, or the fetch cache replayed a stored response (a request
// following a fetch cache run in progress is recorded as replayed too).
var sharedOutcomes = map[string]bool{
	string(packcache.Joined): true, string(packcache.Hit): true, fetchcache.Replayed: true,
}

func limitText(n int) string {
	if n <= 0 {
		return "no limit"
	}
	return strconv.Itoa(n)
}

func (h *Handler) now(w http.ResponseWriter, r *http.Request, who string) {
	h.render(w, "now", page{Title: "Now", Nav: "now", User: who, Data: h.nowData(r.Context())})
}

func (h *Handler) nowJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(h.nowData(r.Context()))
}
