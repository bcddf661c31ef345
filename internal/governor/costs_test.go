package governor

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"packwire/internal/store"
)

var (
	testKinds      = []string{"full-clone", "shallow-clone", "partial-clone", "incremental-fetch", "no-op", "refs", "push", "negotiation"}
	testTransports = []string{"git", "http", "ssh"}
	testResults    = []string{ResultOK, ResultOK, ResultOK, ResultOK, ResultOK, ResultOK, ResultGitError, ResultClientGone, ResultRefused}
)

// randomRecord is a record at start with every field the rollups read drawn
// from rng; wall times are log-uniform from 100 µs to 100 s.
func randomRecord(rng *rand.Rand, start time.Time, repos, users int) Record {
	wall := time.Duration(math.Exp(math.Log(1e5) + rng.Float64()*math.Log(1e6)))
	r := Record{ID: NewID(start), Start: start, Transport: testTransports[rng.Intn(len(testTransports))], Protocol: 2,
		Repo: fmt.Sprintf("team/repo%d", rng.Intn(repos)), User: fmt.Sprintf("user%d", rng.Intn(users)), Remote: "127.0.0.1:1",
		Service: "git-upload-pack", Kind: testKinds[rng.Intn(len(testKinds))], Wants: 1, BytesIn: rng.Int63n(1 << 12),
		BytesOut: rng.Int63n(1 << 24), Wall: Duration(wall), UserCPU: Duration(rng.Int63n(int64(wall/2) + 1)),
		SysCPU: Duration(rng.Int63n(int64(wall/8) + 1)), Result: testResults[rng.Intn(len(testResults))]}
	if rng.Intn(5) == 0 {
		r.User = "" // anonymous
	}
	if r.Kind == "full-clone" {
		r.PackCache = []string{"generated", "joined", "hit", "direct"}[rng.Intn(4)]
	}
	return r
}

// checkAgainstSummarize compares every breakdown and percentile of c with
// Summarize over the same records: sums exactly, percentiles within the
// histogram's resolution.
func checkAgainstSummarize(t *testing.T, g *Governor, c *Costs) {
	t.Helper()
	ctx := context.Background()
	for _, dim := range CostDims {
		want, err := g.Summarize(ctx, c.From, dim, 1000)
		if err != nil {
			t.Fatal(err)
		}
		got := c.By[dim]
		if got.All != len(want) || len(got.Groups) != len(want) {
			t.Fatalf("by %s: %d groups (all %d), Summarize has %d", dim, len(got.Groups), got.All, len(want))
		}
		wantByKey := map[string]Group{}
		for _, w := range want {
			wantByKey[w.Key] = w
		}
		var requests int64
		for i, gr := range got.Groups {
			w := wantByKey[gr.Key]
			if gr.Requests != w.Count || gr.CPU != w.CPU || gr.BytesOut != w.BytesOut || gr.Errors != w.Errors {
				t.Fatalf("by %s, %q: rollup %+v, records %+v", dim, gr.Key, gr, w)
			}
			if i > 0 && gr.CPU > got.Groups[i-1].CPU {
				t.Fatalf("by %s: not ordered by CPU: %v after %v", dim, gr.CPU, got.Groups[i-1].CPU)
			}
			requests += gr.Requests
		}
		if requests != c.Total.Requests {
			t.Fatalf("by %s: %d requests, total %d", dim, requests, c.Total.Requests)
		}
		if dim != "kind" {
			continue
		}
		for _, wp := range c.Walls {
			w := wantByKey[wp.Kind]
			if wp.Requests != w.Count {
				t.Fatalf("walls of %s: %d requests, records %d", wp.Kind, wp.Requests, w.Count)
			}
			for _, p := range []struct{ got, want time.Duration }{{wp.P50, w.P50}, {wp.P95, w.P95}} {
				if ratio := float64(p.got) / float64(p.want); math.Abs(ratio-1) > 0.0222 {
					t.Fatalf("walls of %s: %v from the histogram, %v from the records (%.3f)", wp.Kind, p.got, p.want, ratio)
				}
			}
		}
	}
	var seriesRequests int64
	for _, p := range c.Series {
		seriesRequests += p.Requests
	}
	if seriesRequests != c.Total.Requests {
		t.Fatalf("series holds %d requests, total %d", seriesRequests, c.Total.Requests)
	}
}

func TestCostsMatchSummarize(t *testing.T) {
	g := openTest(t, Options{})
	rng := rand.New(rand.NewSource(3))
	now := time.Now()
	n := int64(2000)
	if raceEnabled {
		n = 500 // the race detector makes SQLite some 30 times slower
	}
	for i := int64(0); i < n; i++ {
		// Up to 80 h back: windows that reach past the minute buckets too.
		g.Record(randomRecord(rng, now.Add(-time.Duration(rng.Int63n(int64(80*time.Hour)))), 12, 5))
	}
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if seq, _ := g.LastSeq(ctx); seq == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer did not write %d records in 30 s", n)
		}
	}
	for _, back := range []time.Duration{time.Hour, 24 * time.Hour, 72 * time.Hour} {
		c, err := g.Costs(ctx, now.Add(-back), now, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if c.Total.Requests == 0 || c.From.After(now.Add(-back)) || c.To.Before(now) {
			t.Fatalf("%s: window %s - %s, %d requests", back, c.From, c.To, c.Total.Requests)
		}
		if len(c.Series) > 100 {
			t.Fatalf("%s: %d points, asked for 100", back, len(c.Series))
		}
		t.Logf("%s: window %s - %s, %d requests, series of %d steps of %s", back, c.From.Format(time.TimeOnly),
			c.To.Format(time.TimeOnly), c.Total.Requests, len(c.Series), c.Step)
		checkAgainstSummarize(t, g, c)
	}
	// A window in the past, past the minute buckets: whole hours.
	c, err := g.Costs(ctx, now.Add(-70*time.Hour-17*time.Minute), now.Add(-60*time.Hour-5*time.Minute), 3, 50)
	if err != nil {
		t.Fatal(err)
	}
	if c.From.Unix()%3600 != 0 || c.To.Unix()%3600 != 0 || len(c.By["repo"].Groups) != 3 || c.By["repo"].All != 12 {
		t.Fatalf("old window: %s - %s, %d of %d repos", c.From, c.To, len(c.By["repo"].Groups), c.By["repo"].All)
	}
	var want int64
	recs, _ := g.Last(ctx, int(n))
	for _, r := range recs {
		if !r.Start.Before(c.From) && r.Start.Before(c.To) {
			want++
		}
	}
	if c.Total.Requests != want {
		t.Fatalf("old window holds %d requests, rollups say %d", want, c.Total.Requests)
	}
}

func TestBackfillInPages(t *testing.T) {
	g, err := Open(context.Background(), filepath.Join(t.TempDir(), FileName))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	testBackfillInPages(t, g)
}

// testBackfillInPages: a backfill longer than a page sums every record once,
// records that share a start included, and writes its sums between pages
// (which PostgreSQL refuses while a page's rows are open: "conn busy").
func testBackfillInPages(t *testing.T, g *Governor) {
	ctx := context.Background()
	defer func(page int) { backfillPage = page }(backfillPage)
	backfillPage = 7
	rng := rand.New(rand.NewSource(11))
	now := time.Now()
	var recs []Record
	for i := 0; i < 60; i++ {
		start := now.Add(-time.Duration(rng.Int63n(int64(20 * time.Hour))))
		if i%5 == 1 {
			start = recs[i-1].Start // ties on start_ns span pages
		}
		r := randomRecord(rng, start, 4, 3)
		r.ID = fmt.Sprintf("rq_page%03d", 60-i) // ids not in start order
		recs = append(recs, r)
	}
	if err := g.write(recs, false); err != nil {
		t.Fatal(err)
	}
	want, err := g.Costs(ctx, now.Add(-24*time.Hour), now, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want.Total.Requests != int64(len(recs)) {
		t.Fatalf("written: %d requests in the rollups, want %d", want.Total.Requests, len(recs))
	}
	// As after a migration that asks for the rollups to be summed again.
	for _, q := range []string{"DELETE FROM request_rollup", "DELETE FROM request_wall_bins", "INSERT INTO rollup_pending VALUES (0)"} {
		if _, err := g.db.DB.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.backfillRollups(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := g.Costs(ctx, now.Add(-24*time.Hour), now, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Total != want.Total {
		t.Fatalf("summed again in pages of %d: %+v, want %+v", backfillPage, got.Total, want.Total)
	}
	checkAgainstSummarize(t, g, got)
}

func TestRollupBackfillAndTrim(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), FileName)
	// A governor database as the release before the rollups left it.
	old, err := store.OpenWith(ctx, path, migrations[:3])
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(5))
	now := time.Now()
	var recs []Record
	for i := 0; i < 500; i++ {
		r := randomRecord(rng, now.Add(-time.Duration(rng.Int63n(int64(30*time.Hour)))), 4, 3)
		if i == 7 {
			r.Kind, r.Result, r.Repo = "push", ResultOK, "team/pushed"
			r.Start = now.Add(-2 * time.Hour)
		}
		recs = append(recs, r)
	}
	for _, r := range recs {
		if _, err := old.DB.Exec(`INSERT INTO requests (id, start_ns, transport, protocol, repo, user, remote, service, kind,
			wants, haves, depth, filter, pushed_refs, bytes_in, bytes_out, queue_ns, wall_ns, cpu_user_ns, cpu_sys_ns, max_rss,
			exit_code, result, error, pack_cache) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			r.ID, r.Start.UnixNano(), r.Transport, r.Protocol, r.Repo, r.User, r.Remote, r.Service, r.Kind, r.Wants, r.Haves,
			r.Depth, r.Filter, r.PushedRefs, r.BytesIn, r.BytesOut, 0, int64(r.Wall), int64(r.UserCPU), int64(r.SysCPU), 0, 0,
			r.Result, "", r.PackCache); err != nil {
			t.Fatal(err)
		}
	}
	old.Close()

	g, err := Open(ctx, path) // migrates and sums the old records
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	c, err := g.Costs(ctx, now.Add(-24*time.Hour), now, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkAgainstSummarize(t, g, c)
	pushes, err := g.LastPushes(ctx)
	if err != nil || pushes["team/pushed"].UnixNano() != now.Add(-2*time.Hour).UnixNano() {
		t.Fatalf("last pushes: %v %v", pushes, err)
	}
	// Opening again sums nothing twice.
	g.Close()
	if g, err = Open(ctx, path); err != nil {
		t.Fatal(err)
	}
	again, err := g.Costs(ctx, now.Add(-24*time.Hour), now, 0, 0)
	if err != nil || again.Total != c.Total {
		t.Fatalf("after reopening: %+v, before %+v (%v)", again.Total, c.Total, err)
	}

	// Retention: records older than 10 h go, and their hours of rollups with them.
	g.opts.MaxAge = 10 * time.Hour
	if _, err := g.Trim(ctx, now); err != nil {
		t.Fatal(err)
	}
	c, err = g.Costs(ctx, now.Add(-24*time.Hour), now, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kept int64
	for _, r := range recs {
		if !r.Start.Before(now.Add(-10 * time.Hour)) {
			kept++
		}
	}
	// The oldest kept record's hour is kept whole: it may hold trimmed records.
	var sameHour int64
	for _, r := range recs {
		if r.Start.Before(now.Add(-10*time.Hour)) && r.Start.Unix() >= floorTo(now.Add(-10*time.Hour).Unix(), 3600) {
			sameHour++
		}
	}
	if c.Total.Requests < kept || c.Total.Requests > kept+sameHour {
		t.Fatalf("after trim: rollups hold %d requests, records %d (+ up to %d in the cut hour)", c.Total.Requests, kept, sameHour)
	}
}

func TestWindowSpans(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 34, 56, 0, time.UTC)
	at := func(h, m int) time.Time { return time.Date(2026, 11, 21, h, m, 0, 0, time.UTC) }
	for _, tc := range []struct {
		from, to time.Time
		want     []span
	}{
		{at(12, 0).Add(-30 * time.Second), now, []span{{60, at(11, 59).Unix(), at(12, 35).Unix()}}},
		{at(10, 15), at(12, 20), []span{{60, at(10, 15).Unix(), at(11, 0).Unix()}, {3600, at(11, 0).Unix(), at(12, 0).Unix()}, {60, at(12, 0).Unix(), at(12, 20).Unix()}}},
		{at(10, 0), at(12, 0), []span{{3600, at(10, 0).Unix(), at(12, 0).Unix()}}},
		// Past the minute buckets: whole hours.
		{now.Add(-72*time.Hour - 10*time.Minute), now.Add(-60*time.Hour - 10*time.Minute), []span{{3600, at(12, 0).Add(-72 * time.Hour).Unix(), at(12, 0).Add(-59 * time.Hour).Unix()}}},
		{now, now.Add(-time.Hour), nil},
		// An end within a minute's first second still takes that minute in.
		{at(12, 0), at(12, 30).Add(time.Second / 2), []span{{60, at(12, 0).Unix(), at(12, 31).Unix()}}},
	} {
		got, _, _ := window(tc.from, tc.to, now)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("window(%s, %s) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

// BenchmarkCostsMillionRecords is the dashboard's Costs page over a
// million request records in one day (a server at its default
// --records-max-count, all of it within the 24 h window). The records go
// in through the writer's own path (records and rollups in one
// transaction per batch), about 20 s before the timer starts:
//
//	go test -run '^$' -bench CostsMillionRecords -benchtime 5x ./internal/governor
func BenchmarkCostsMillionRecords(b *testing.B) {
	g, err := Open(context.Background(), filepath.Join(b.TempDir(), FileName))
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewSource(1))
	now := time.Now()
	const n, batch = 1_000_000, 10_000
	start := time.Now()
	recs := make([]Record, 0, batch)
	for i := 0; i < n; i++ {
		recs = append(recs, randomRecord(rng, now.Add(-24*time.Hour+time.Duration(i)*(24*time.Hour/n)), 50, 20))
		if len(recs) == batch {
			if err := g.insert(recs); err != nil {
				b.Fatal(err)
			}
			recs = recs[:0]
		}
	}
	b.Logf("inserted %d records with their rollups in %s", n, time.Since(start).Round(time.Millisecond))
	b.ResetTimer()
	for b.Loop() {
		c, err := g.Costs(ctx, now.Add(-24*time.Hour), now, 20, 150)
		if err != nil {
			b.Fatal(err)
		}
		if c.Total.Requests != n || len(c.By["repo"].Groups) != 20 || c.By["repo"].All != 50 || len(c.Walls) != len(testKinds) {
			b.Fatalf("costs of the day: %d requests, %d of %d repos, %d kinds", c.Total.Requests, len(c.By["repo"].Groups), c.By["repo"].All, len(c.Walls))
		}
	}
}

// A request one cluster node relayed to another is recorded by both: every
// total counts it once (where git ran), the node breakdown shows both.
func TestRelayedRequestsCountOnce(t *testing.T) {
	g := openTest(t, Options{})
	now := time.Now()
	served := record(now.Add(-time.Minute), "full-clone", 40*time.Millisecond, 10*time.Millisecond)
	served.Node, served.Transport, served.User = "b", "ssh", "alice"
	relay := served
	relay.ID, relay.Node, relay.PackCache, relay.UserCPU = NewID(now), "a", PackCacheRelayed, 0
	own := record(now.Add(-time.Minute), "push", 30*time.Millisecond, 5*time.Millisecond)
	own.Node = "a"
	for _, r := range []Record{served, relay, own} {
		g.Record(r)
	}
	waitCount(t, g, 3)
	ctx := context.Background()
	c, err := g.Costs(ctx, now.Add(-time.Hour), now.Add(time.Minute), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if c.Total.Requests != 2 || c.Total.BytesOut != 2000 || c.Total.CPU != 15*time.Millisecond {
		t.Fatalf("total %+v: want 2 requests, 2000 bytes out, 15ms of CPU", c.Total)
	}
	byKey := func(b Breakdown) map[string]int64 {
		m := map[string]int64{}
		for _, gr := range b.Groups {
			m[gr.Key] = gr.Requests
		}
		return m
	}
	if got := byKey(c.By["kind"]); got["full-clone"] != 1 || got["push"] != 1 {
		t.Fatalf("by kind %v: the relayed clone counted twice", got)
	}
	if got := byKey(c.By["node"]); got["a"] != 2 || got["b"] != 1 {
		t.Fatalf("by node %v: want a 2 (one relayed), b 1", got)
	}
	for _, w := range c.Walls {
		if w.Kind == "full-clone" && w.Requests != 1 {
			t.Fatalf("wall percentiles of %d full clones, want 1", w.Requests)
		}
	}
	kinds, err := g.Summarize(ctx, now.Add(-time.Hour), "kind", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kinds {
		if k.Count != 1 {
			t.Fatalf("summary by kind: %s counted %d times", k.Key, k.Count)
		}
	}
	nodes, err := g.Summarize(ctx, now.Add(-time.Hour), "node", 10)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("summary by node: %+v, %v", nodes, err)
	}
	onA, err := g.SummarizeWhere(ctx, now.Add(-time.Hour), "kind", 10, Filter{Node: "a"})
	if err != nil || len(onA) != 2 {
		t.Fatalf("node a by kind: %+v, %v: want its push and its relay", onA, err)
	}
	rec := httptest.NewRecorder()
	g.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	metrics := rec.Body.String()
	for _, want := range []string{
		`packwire_requests_total{kind="full-clone",result="ok",service="git-upload-pack",transport="ssh"} 1`,
		`packwire_relayed_requests_total{kind="full-clone",result="ok",service="git-upload-pack",transport="ssh"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("metrics lack %s", want)
		}
	}
}
