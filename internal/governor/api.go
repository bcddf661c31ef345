package governor

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// APIPage is the answer of GET /api/v1/requests: records in write order and
// the cursor to ask for the next page with ?after=.
type APIPage struct {
	Records []Record `json:"records"`
	Next    int64    `json:"next"`
}

// APIHandler serves GET /api/v1/requests?since=TIME&after=SEQ&limit=N for the
// lab. since is RFC 3339 or a duration back from now ("10m"); after is the
// cursor of the previous page. authorize decides who may read: it returns 0
// to allow, or the HTTP status to refuse with (401, 403).
func (g *Governor) APIHandler(authorize func(*http.Request) int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status := authorize(r); status != 0 {
			if status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Basic realm="packwire", charset="UTF-8"`)
			}
			http.Error(w, "an admin token is required", status)
			return
		}
		q := r.URL.Query()
		var since time.Time
		if s := q.Get("since"); s != "" {
			if d, err := time.ParseDuration(s); err == nil {
				since = time.Now().Add(-d)
			} else if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
				since = t
			} else {
				http.Error(w, "since: want RFC 3339 time or a duration like 10m", http.StatusBadRequest)
				return
			}
		}
		after, _ := strconv.ParseInt(q.Get("after"), 10, 64)
		limit, err := strconv.Atoi(q.Get("limit"))
		if err != nil || limit <= 0 || limit > 10_000 {
			limit = 1000
		}
		recs, next, err := g.After(r.Context(), after, since, limit)
		if err != nil {
			http.Error(w, "reading request records failed", http.StatusInternalServerError)
			return
		}
		if recs == nil {
			recs = []Record{}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(APIPage{Records: recs, Next: next})
	})
}
