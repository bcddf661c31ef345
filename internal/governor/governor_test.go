package governor

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"
)

func openTest(t *testing.T, opts Options) *Governor {
	t.Helper()
	g, err := Open(context.Background(), filepath.Join(t.TempDir(), FileName))
	if err != nil {
		t.Fatal(err)
	}
	opts.FlushInterval = 10 * time.Millisecond
	g.Start(opts)
	t.Cleanup(func() { g.Close() })
	return g
}

func record(start time.Time, kind string, wall, cpu time.Duration) Record {
	return Record{ID: NewID(start), Start: start, Transport: "git", Service: "git-upload-pack", Kind: kind, Repo: "r",
		Wall: Duration(wall), UserCPU: Duration(cpu), BytesOut: 1000, Result: ResultOK}
}

func waitCount(t *testing.T, g *Governor, n int) {
	t.Helper()
	// Records are written by the governor's own goroutine: on a loaded
	// machine that can take seconds (2 s was too short under load 50).
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		recs, _ := g.Last(context.Background(), n+1)
		if len(recs) == n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	recs, _ := g.Last(context.Background(), n+10)
	t.Fatalf("want %d records, have %d", n, len(recs))
}

func TestRetentionByAgeAndRows(t *testing.T) {
	g := openTest(t, Options{MaxAge: time.Hour, MaxRows: 5})
	now := time.Now()
	for i := 0; i < 3; i++ {
		g.Record(record(now.Add(-2*time.Hour), "full-clone", time.Second, time.Second))
	}
	for i := 0; i < 8; i++ {
		g.Record(record(now.Add(time.Duration(i)*time.Millisecond), "no-op", time.Millisecond, 0))
	}
	waitCount(t, g, 11)
	n, err := g.Trim(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	if n != 6 {
		t.Fatalf("trimmed %d, want 3 by age and 3 by rows", n)
	}
	recs, _ := g.Last(context.Background(), 100)
	if len(recs) != 5 || recs[0].Kind != "no-op" || recs[4].Start.UnixNano() != now.Add(7*time.Millisecond).UnixNano() {
		t.Fatalf("kept %d records: %+v", len(recs), recs)
	}
}

// TestSetRetention: bounds set while the governor runs are the next
// trim's.
func TestSetRetention(t *testing.T) {
	g := openTest(t, Options{})
	now := time.Now()
	for i := 0; i < 4; i++ {
		g.Record(record(now.Add(time.Duration(i)*time.Millisecond), "no-op", time.Millisecond, 0))
	}
	waitCount(t, g, 4)
	g.SetRetention(0, 2)
	if n, err := g.Trim(context.Background(), now); err != nil || n != 2 {
		t.Fatalf("trimmed %d (%v), want 2 past the new bound of 2 records", n, err)
	}
}

func TestSummarize(t *testing.T) {
	g := openTest(t, Options{})
	now := time.Now()
	for i := 1; i <= 100; i++ {
		g.Record(record(now, "full-clone", time.Duration(i)*time.Millisecond, 10*time.Millisecond))
	}
	g.Record(record(now, "no-op", time.Millisecond, time.Millisecond))
	old := record(now.Add(-48*time.Hour), "shallow-fetch", time.Second, time.Second)
	g.Record(old)
	waitCount(t, g, 102)
	groups, err := g.Summarize(context.Background(), now.Add(-time.Hour), "kind", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 2 || groups[0].Key != "full-clone" {
		t.Fatalf("groups: %+v", groups)
	}
	fc := groups[0]
	if fc.Count != 100 || fc.P50 != 50*time.Millisecond || fc.P95 != 95*time.Millisecond || fc.P99 != 99*time.Millisecond ||
		fc.CPU != time.Second || fc.CPUPerReq != 10*time.Millisecond || fc.BytesOut != 100_000 {
		t.Fatalf("full-clone group: %+v", fc)
	}
	if _, err := g.Summarize(context.Background(), now, "repo; DROP TABLE requests", 10); err == nil {
		t.Fatal("grouping by an arbitrary column was accepted")
	}
	// Records survive the JSON round trip the lab's API uses.
	recs, _ := g.Last(context.Background(), 1)
	b, _ := json.Marshal(recs[0])
	var back Record
	if err := json.Unmarshal(b, &back); err != nil || back.Wall != recs[0].Wall || back.ID != recs[0].ID {
		t.Fatalf("round trip: %v %s", err, b)
	}
}

func TestAfterPaginates(t *testing.T) {
	g := openTest(t, Options{})
	for i := 0; i < 25; i++ {
		g.Record(record(time.Now(), fmt.Sprint("k", i), 0, 0))
	}
	waitCount(t, g, 25)
	var seq int64
	seen := 0
	for {
		recs, next, err := g.After(context.Background(), seq, time.Time{}, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		seen += len(recs)
		seq = next
	}
	if seen != 25 {
		t.Fatalf("paged through %d records", seen)
	}
}

func TestAPIHandler(t *testing.T) {
	g := openTest(t, Options{})
	now := time.Now()
	g.Record(record(now.Add(-time.Hour), "full-clone", time.Second, time.Second))
	for i := 0; i < 3; i++ {
		g.Record(record(now, "no-op", time.Millisecond, 0))
	}
	waitCount(t, g, 4)
	h := g.APIHandler(func(r *http.Request) int {
		switch r.Header.Get("Authorization") {
		case "admin":
			return 0
		case "":
			return http.StatusUnauthorized
		}
		return http.StatusForbidden
	})
	get := func(url, auth string) (*httptest.ResponseRecorder, APIPage) {
		req := httptest.NewRequest("GET", url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var page APIPage
		json.Unmarshal(rec.Body.Bytes(), &page)
		return rec, page
	}
	if rec, _ := get("/api/v1/requests", ""); rec.Code != 401 || rec.Header().Get("WWW-Authenticate") == "" {
		t.Fatalf("no token: %d", rec.Code)
	}
	if rec, page := get("/api/v1/requests", "user"); rec.Code != 403 || len(page.Records) != 0 {
		t.Fatalf("non-admin: %d %d records", rec.Code, len(page.Records))
	}
	_, page := get("/api/v1/requests?since=10m", "admin")
	if len(page.Records) != 3 || page.Next == 0 {
		t.Fatalf("since=10m: %+v", page)
	}
	_, page = get("/api/v1/requests?limit=2", "admin")
	if len(page.Records) != 2 {
		t.Fatalf("limit: %d", len(page.Records))
	}
	_, rest := get(fmt.Sprintf("/api/v1/requests?after=%d", page.Next), "admin")
	if len(rest.Records) != 2 || rest.Records[0].ID == page.Records[1].ID {
		t.Fatalf("after: %+v", rest)
	}
	if rec, _ := get("/api/v1/requests?since=yesterday", "admin"); rec.Code != 400 {
		t.Fatalf("bad since: %d", rec.Code)
	}
}

// TestRecordsCarryVersion: a record takes the version the governor was
// started with, and reads back with it; one given its own keeps it.
func TestRecordsCarryVersion(t *testing.T) {
	g := openTest(t, Options{Version: "v1.2.3"})
	now := time.Now()
	g.Record(record(now, "full-clone", time.Millisecond, 0))
	own := record(now.Add(time.Millisecond), "no-op", time.Millisecond, 0)
	own.Version = "v1.2.2"
	g.Record(own)
	waitCount(t, g, 2)
	recs, err := g.Last(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if recs[0].Version != "v1.2.3" || recs[1].Version != "v1.2.2" {
		t.Fatalf("versions %q, %q; want v1.2.3, v1.2.2", recs[0].Version, recs[1].Version)
	}
	// Costs by build: what an upgrade changed.
	groups, err := g.Summarize(context.Background(), now.Add(-time.Hour), "version", 10)
	if err != nil || len(groups) != 2 {
		t.Fatalf("by version: %+v %v", groups, err)
	}
	for _, gr := range groups {
		if (gr.Key != "v1.2.3" && gr.Key != "v1.2.2") || gr.Count != 1 {
			t.Errorf("by version: group %+v", gr)
		}
	}
}
