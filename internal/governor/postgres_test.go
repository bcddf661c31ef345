package governor

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/pgtest"
)

// TestPostgres runs the governor on a real PostgreSQL (a cluster's shared
// database): the same answers as SQLite, and several nodes writing and
// trimming at once.
func TestPostgres(t *testing.T) {
	pg := pgtest.Start(t)
	t.Run("EnginesAgree", func(t *testing.T) { testEnginesAgree(t, pg) })
	t.Run("NodesWriteTogether", func(t *testing.T) { testNodesWriteTogether(t, pg) })
	t.Run("BackfillInPages", func(t *testing.T) {
		g, err := OpenPostgres(context.Background(), pg.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		testBackfillInPages(t, g)
	})
	t.Run("SurvivesRestart", func(t *testing.T) { testSurvivesRestart(t, pg) }) // last: it restarts the server
}

// testSurvivesRestart: PostgreSQL restarts while a node records requests.
// The writes that fail meanwhile are tried again: every record is written
// once, and the rollups hold each once.
func testSurvivesRestart(t *testing.T, pg *pgtest.Server) {
	ctx := context.Background()
	g, err := OpenPostgres(ctx, pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var logs lockedLog
	g.Start(Options{FlushInterval: 5 * time.Millisecond, Node: "n", Log: slog.New(slog.NewTextHandler(&logs, nil))})
	rng := rand.New(rand.NewSource(31))
	now := time.Now()
	stop := make(chan struct{})
	written := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				written <- n
				return
			case <-time.After(2 * time.Millisecond):
			}
			r := randomRecord(rng, now.Add(-time.Duration(rng.Int63n(int64(10*time.Minute)))), 5, 3)
			r.ID = fmt.Sprintf("rq_restart%05d", n)
			g.Record(r)
			n++
		}
	}()
	time.Sleep(100 * time.Millisecond)
	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	n := <-written
	var recs []Record
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if recs, err = g.Last(ctx, 2*n); err == nil && len(recs) >= n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records written 30 s after the restart (%v)\n%s", len(recs), n, err, logs.String())
		}
	}
	// The writer logs the retry's success after its commit, which the
	// test may see first: wait for the line (a failed write is retried
	// retryWait later, and a write that failed at its commit may have
	// landed all the same, its records seen before the retry runs).
	for deadline := time.Now().Add(10 * retryWait); !strings.Contains(logs.String(), "written after failed tries"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no write failed while PostgreSQL restarted: the test tested nothing\n%s", logs.String())
		}
	}
	ids := map[string]bool{}
	for _, r := range recs {
		ids[r.ID] = true
	}
	if len(recs) != n || len(ids) != n {
		t.Fatalf("%d records (%d ids) for %d requests", len(recs), len(ids), n)
	}
	c, err := g.Costs(ctx, now.Add(-time.Hour), now.Add(time.Minute), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.Total.Requests != int64(n) {
		t.Fatalf("rollups hold %d requests, %d were recorded", c.Total.Requests, n)
	}
	checkAgainstSummarize(t, g, c)
}

// lockedLog is a log destination the writer and the test share.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// testEnginesAgree writes the same records and maintenance runs to SQLite
// and to PostgreSQL and wants every query to answer the same: one schema
// and one set of queries serve both engines.
func testEnginesAgree(t *testing.T, pg *pgtest.Server) {
	ctx := context.Background()
	now := time.Now() // both governors reckon windows from this instant
	lite, err := Open(ctx, filepath.Join(t.TempDir(), FileName))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	post, err := OpenPostgres(ctx, pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer post.Close()

	want := exerciseGovernor(t, lite, now)
	got := exerciseGovernor(t, post, now)
	if got != want {
		t.Fatalf("PostgreSQL and SQLite disagree.\nSQLite:\n%s\nPostgreSQL:\n%s", want, got)
	}
	for _, s := range []string{"summary by user", `"user0"`, "by node (of 2)", "last of n2: rq_test0399 n2", "last push team/repo", "maintenance team/repo1 full", "trimmed 1", "after page"} {
		if !strings.Contains(want, s) {
			t.Errorf("transcript lacks %q:\n%s", s, want)
		}
	}
}

// exerciseGovernor writes a fixed set of records through the batch writer,
// then asks every query, and returns what it saw.
func exerciseGovernor(t *testing.T, g *Governor, now time.Time) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	say := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	g.clock = func() time.Time { return now }
	g.Start(Options{FlushInterval: 5 * time.Millisecond, Node: "n1", MaxRows: 1000})
	rng := rand.New(rand.NewSource(11))
	const n = 400
	for i := 0; i < n; i++ {
		// Within 40 h (minute buckets) or 60-80 h back (hour buckets
		// only), never near the 48 h edge between them.
		back := time.Duration(rng.Int63n(int64(40 * time.Hour)))
		if i%5 == 0 {
			back = 60*time.Hour + time.Duration(rng.Int63n(int64(20*time.Hour)))
		}
		r := randomRecord(rng, now.Add(-back).Truncate(time.Microsecond), 6, 4)
		r.ID = fmt.Sprintf("rq_test%04d", i)
		if i%3 == 0 {
			r.Node = "n2" // recorded as another node's
		}
		if i%7 == 0 {
			r.Kind, r.Result = "push", ResultOK
		}
		r.Error = "line one\nline 'two' ?"
		g.Record(r)
	}
	g.stopWriter() // writes what is queued; queries go on below

	seq, err := g.LastSeq(ctx)
	must(err)
	say("last seq %d", seq)
	recs, err := g.Last(ctx, 5)
	must(err)
	for _, r := range recs {
		say("last %s %s %s %q %s %s %d %d %v %v %s %q %s", r.ID, r.Start.UTC().Format(time.RFC3339Nano), r.Repo, r.User, r.Kind,
			r.Transport, r.BytesIn, r.BytesOut, time.Duration(r.Wall), r.CPU(), r.Result, r.Error, r.Node)
	}
	var cursor int64
	pages := 0
	for {
		page, next, err := g.After(ctx, cursor, now.Add(-50*time.Hour), 64)
		must(err)
		if len(page) == 0 {
			break
		}
		pages++
		say("after page %d: %d records, first %s, next %d", pages, len(page), page[0].ID, next)
		cursor = next
	}
	for _, by := range []string{"repo", "user", "kind", "transport", "service", "result", "node"} {
		groups, err := g.Summarize(ctx, now.Add(-30*time.Hour), by, 4)
		must(err)
		say("summary by %s", by)
		for _, gr := range groups {
			say("  %q %d p50=%v p95=%v p99=%v cpu=%v out=%d errors=%d", gr.Key, gr.Count, gr.P50, gr.P95, gr.P99, gr.CPU, gr.BytesOut, gr.Errors)
		}
	}
	onN2, err := g.SummarizeWhere(ctx, now.Add(-30*time.Hour), "repo", 3, Filter{Node: "n2"})
	must(err)
	say("summary of node n2 by repo: %+v", onN2)
	lastN2, err := g.LastWhere(ctx, 3, Filter{Node: "n2"})
	must(err)
	for _, r := range lastN2 {
		say("last of n2: %s %s", r.ID, r.Node)
	}
	for _, w := range []struct{ from, to time.Duration }{{time.Hour, 0}, {24 * time.Hour, 0}, {80 * time.Hour, 0}, {75 * time.Hour, 61 * time.Hour}} {
		c, err := g.Costs(ctx, now.Add(-w.from), now.Add(-w.to), 3, 40)
		must(err)
		say("costs %s-%s: %s - %s total %+v step %s points %d", w.from, w.to, c.From.UTC().Format(time.RFC3339), c.To.UTC().Format(time.RFC3339), c.Total, c.Step, len(c.Series))
		for _, dim := range CostDims {
			say("  by %s (of %d): %+v", dim, c.By[dim].All, c.By[dim].Groups)
		}
		say("  walls %+v", c.Walls)
		var reqs int64
		for _, p := range c.Series {
			reqs += p.Requests
		}
		say("  series requests %d", reqs)
	}
	for _, dim := range []string{"pack_cache", "repo_kind", "node"} {
		bd, err := g.Breakdown(ctx, dim, now.Add(-30*time.Hour), now, 0)
		must(err)
		say("breakdown %s: %+v", dim, bd)
	}
	pushes, err := g.LastPushes(ctx)
	must(err)
	var repos []string
	for repo := range pushes {
		repos = append(repos, repo)
	}
	sort.Strings(repos)
	for _, repo := range repos {
		say("last push %s %s", repo, pushes[repo].UTC().Format(time.RFC3339Nano))
	}
	for i, repo := range []string{"team/repo1", "team/repo2", "team/repo1"} {
		must(g.RecordMaintenance(ctx, MaintenanceRun{Repo: repo, Start: now.Add(time.Duration(i) * time.Second), Wall: time.Second,
			UserCPU: time.Millisecond, Kind: "full", Reason: "first run", PacksBefore: 3, BytesBefore: 100, PacksAfter: 1, BytesAfter: 80, Result: "ok"}))
	}
	runs, err := g.LastMaintenance(ctx, "team/repo1", 5)
	must(err)
	for _, r := range runs {
		say("maintenance %s %s %s %s %s %d->%d", r.Repo, r.Kind, r.Start.UTC().Format(time.RFC3339Nano), r.Node, r.Result, r.PacksBefore, r.PacksAfter)
	}
	latest, err := g.LatestMaintenance(ctx)
	must(err)
	say("latest maintenance of %d repos, repo2 at %s", len(latest), latest["team/repo2"].Start.UTC().Format(time.RFC3339Nano))
	g.opts.MaxAge, g.opts.MaxRows = 70*time.Hour, 0
	trimmed, err := g.Trim(ctx, now)
	must(err)
	say("trimmed by age %d", trimmed)
	g.opts.MaxAge, g.opts.MaxRows = 0, 250
	trimmed, err = g.Trim(ctx, now)
	must(err)
	say("trimmed by rows %d", trimmed)
	g.opts.MaxRows = 249
	trimmed, err = g.Trim(ctx, now)
	must(err)
	say("trimmed %d", trimmed)
	c, err := g.Costs(ctx, now.Add(-80*time.Hour), now, 0, 0)
	must(err)
	say("costs after trim: %+v", c.Total)
	recs, err = g.Last(ctx, 1000)
	must(err)
	say("records left %d, oldest %s", len(recs), recs[0].ID)
	return b.String()
}

// testNodesWriteTogether: two nodes' governors write records for the same
// minutes into one PostgreSQL database at the same time, and trim it at
// the same time, while a third reads. Every figure adds up exactly: the
// rollups equal the sums over the records, each node's share is its own,
// and a reader paging by seq sees every record once.
func testNodesWriteTogether(t *testing.T, pg *pgtest.Server) {
	ctx := context.Background()
	url := pg.NewDatabase(t)
	nodes := []string{"node-a", "node-b"}
	// Opening together: the schema is made once, the backfill runs once.
	govs := make([]*Governor, len(nodes))
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes))
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := OpenPostgres(ctx, url)
			govs[i] = g
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, g := range govs {
		// MaxAge trims nothing written here; the trim still runs on
		// both nodes with the writers (every minute in a server).
		g.Start(Options{FlushInterval: time.Millisecond, Node: nodes[i], MaxAge: 1000 * time.Hour})
	}
	reader, err := OpenPostgres(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()

	now := time.Now()
	perNode := 1500
	if raceEnabled {
		perNode = 400
	}
	// Both nodes draw the same starts: every record shares its minute
	// (and hour, and wall bin) buckets with the other node's.
	type sums struct{ requests, cpu, bytesOut int64 }
	want := map[string]*sums{}
	stopReading := make(chan struct{})
	seen := map[string]int{}
	var readErr error
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		var cursor int64
		for done := false; !done; {
			select {
			case <-stopReading:
				done = true // one last page below
			case <-time.After(2 * time.Millisecond):
			}
			for {
				page, next, err := reader.After(ctx, cursor, time.Time{}, 500)
				if err != nil {
					readErr = err
					return
				}
				for _, r := range page {
					seen[r.ID]++
				}
				cursor = next
				if len(page) < 500 {
					break
				}
			}
		}
	}()
	var trims sync.WaitGroup
	for i, g := range govs {
		want[nodes[i]] = &sums{}
		rng := rand.New(rand.NewSource(21))
		var recs []Record
		for j := 0; j < perNode; j++ {
			r := randomRecord(rng, now.Add(-time.Duration(rng.Int63n(int64(10*time.Minute)))), 5, 3)
			r.ID = fmt.Sprintf("rq_%s_%05d", nodes[i], j)
			recs = append(recs, r)
			s := want[nodes[i]]
			s.requests++
			s.cpu += int64(r.CPU())
			s.bytesOut += r.BytesOut
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j, r := range recs {
				g.Record(r)
				if j%100 == 0 {
					time.Sleep(time.Millisecond) // many small batches, interleaved with the other node's
				}
			}
		}()
		trims.Add(1)
		go func() {
			defer trims.Done()
			for k := 0; k < 20; k++ {
				if _, err := g.Trim(ctx, time.Now()); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(3 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	trims.Wait()
	for _, g := range govs {
		g.Close() // writes what is queued
	}
	close(stopReading)
	<-readerDone
	if readErr != nil {
		t.Fatal(readErr)
	}
	if len(seen) != 2*perNode {
		t.Fatalf("the reader paging by seq saw %d records, %d were written", len(seen), 2*perNode)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("the reader saw %s %d times", id, n)
		}
	}

	c, err := reader.Costs(ctx, now.Add(-time.Hour), now.Add(time.Minute), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.Total.Requests != int64(2*perNode) {
		t.Fatalf("costs total %d requests, %d written", c.Total.Requests, 2*perNode)
	}
	byNode := c.By["node"]
	if len(byNode.Groups) != len(nodes) {
		t.Fatalf("by node: %+v", byNode)
	}
	for _, gr := range byNode.Groups {
		w := want[gr.Key]
		if w == nil || gr.Requests != w.requests || int64(gr.CPU) != w.cpu || gr.BytesOut != w.bytesOut {
			t.Fatalf("node %q: rollups %+v, written %+v", gr.Key, gr, w)
		}
	}
	// Every breakdown, percentile and the series against the records.
	checkAgainstSummarize(t, reader, c)
	groups, err := reader.Summarize(ctx, now.Add(-time.Hour), "node", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, gr := range groups {
		if w := want[gr.Key]; w == nil || gr.Count != w.requests || int64(gr.CPU) != w.cpu {
			t.Fatalf("summary of node %q: %+v, written %+v", gr.Key, gr, w)
		}
	}
}
