package governor

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"packwire/internal/store"
)

// CostGroup is what the requests sharing one key cost in a window: the same
// sums as a Summarize group (errors are results other than ok and
// challenged).
type CostGroup struct {
	Key      string        `json:"key"`
	Key2     string        `json:"key2,omitempty"` // repo_kind: the kind
	Requests int64         `json:"requests"`
	Errors   int64         `json:"errors"`
	CPU      time.Duration `json:"cpu_ns"` // git user + system
	BytesIn  int64         `json:"bytes_in"`
	BytesOut int64         `json:"bytes_out"`
	Wall     time.Duration `json:"wall_ns"` // summed over the requests
}

// CPUPerRequest is the mean git CPU of one request.
func (c CostGroup) CPUPerRequest() time.Duration {
	return c.CPU / time.Duration(max(c.Requests, 1))
}

// WallPercentiles are the wall time percentiles of one kind of request.
type WallPercentiles struct {
	Kind     string        `json:"kind"`
	Requests int64         `json:"requests"`
	P50      time.Duration `json:"wall_p50_ns"`
	P95      time.Duration `json:"wall_p95_ns"`
}

// CostPoint is one step of the cost time series.
type CostPoint struct {
	Start    time.Time     `json:"start"`
	Requests int64         `json:"requests"`
	CPU      time.Duration `json:"cpu_ns"`
}

// Breakdown is one dimension's groups, the costliest first, cut to a top.
type Breakdown struct {
	Groups []CostGroup `json:"groups"`
	All    int         `json:"all"` // groups in the window before the cut
}

// Costs summarises a window for the dashboard.
type Costs struct {
	// From and To are the window summed: whole minutes, or whole hours
	// where it reaches back past MinuteRowsKept.
	From  time.Time            `json:"from"`
	To    time.Time            `json:"to"`
	Total CostGroup            `json:"total"`
	By    map[string]Breakdown `json:"by"` // repo, user, kind, transport
	Walls []WallPercentiles    `json:"walls"`
	// Percentiles come from 1/16-octave histograms: within 2.2% of the
	// exact nearest-rank value Summarize computes from the records.
	Step   time.Duration `json:"step_ns"`
	Series []CostPoint   `json:"series"`
}

// CostDims are the breakdowns Costs returns, in the order a page shows them.
// node is every record's cluster node ("" on a single server): pages show
// it only for a cluster.
var CostDims = []string{"repo", "user", "kind", "transport", "node"}

// span is a range of buckets of one width: [from, to) in unix seconds.
type span struct{ width, from, to int64 }

func floorTo(sec, w int64) int64 { return floorDiv(sec, w) * w }
func ceilTo(sec, w int64) int64  { return -floorDiv(-sec, w) * w }

// minuteFrom is the first unix second from which minute buckets are
// complete (an hour of margin before the trim horizon).
func minuteFrom(now time.Time) int64 {
	return ceilTo(now.Add(-MinuteRowsKept+time.Hour).Unix(), hourWidth)
}

// window turns [from, to) into bucket spans: minute buckets at the edges,
// hour buckets in between, hour buckets only where minute ones are gone.
func window(from, to, now time.Time) (spans []span, f, t int64) {
	// to's fraction of a second counts: 12:00:00.5 must take in minute 12:00.
	tu := to.Unix()
	if to.Nanosecond() > 0 {
		tu++
	}
	f, t = floorTo(from.Unix(), minuteWidth), ceilTo(tu, minuteWidth)
	mf := minuteFrom(now)
	if f < mf {
		f = floorTo(f, hourWidth)
	}
	if t < mf {
		t = ceilTo(t, hourWidth)
	}
	if t <= f {
		return nil, f, f
	}
	h1, h2 := ceilTo(f, hourWidth), floorTo(t, hourWidth)
	if h1 >= h2 {
		return []span{{minuteWidth, f, t}}, f, t
	}
	if f < h1 {
		spans = append(spans, span{minuteWidth, f, h1})
	}
	spans = append(spans, span{hourWidth, h1, h2})
	if h2 < t {
		spans = append(spans, span{minuteWidth, h2, t})
	}
	return spans, f, t
}

// spanSQL is a UNION ALL of one SELECT per span over table, with the
// extra condition, and the arguments to go with it.
func spanSQL(spans []span, cols, table, cond string, condArgs ...any) (string, []any) {
	var parts []string
	var args []any
	for _, s := range spans {
		parts = append(parts, fmt.Sprintf("SELECT %s FROM %s WHERE width = ? AND %s AND bucket >= ? AND bucket < ?", cols, table, cond))
		args = append(args, s.width)
		args = append(args, condArgs...)
		args = append(args, s.from, s.to)
	}
	return "(" + strings.Join(parts, " UNION ALL ") + ") AS spans", args
}

// Breakdown returns one dimension's groups in [from, to), the costliest
// (git CPU, then requests) first, at most top of them (0: all). dim is
// one of "", repo, user, kind, transport, pack_cache, repo_kind.
func (g *Governor) Breakdown(ctx context.Context, dim string, from, to time.Time, top int) (Breakdown, error) {
	spans, _, _ := window(from, to, g.now())
	return g.breakdown(ctx, dim, spans, top)
}

func (g *Governor) breakdown(ctx context.Context, dim string, spans []span, top int) (Breakdown, error) {
	known := false
	for _, d := range rollupDims {
		known = known || d == dim
	}
	if !known {
		return Breakdown{}, fmt.Errorf("no breakdown by %q", dim)
	}
	if len(spans) == 0 {
		return Breakdown{}, nil
	}
	if dim == "repo_kind" {
		// Kept by the hour only: widen the minute edges to their hours.
		first, last := spans[0], spans[len(spans)-1]
		spans = []span{{hourWidth, floorTo(first.from, hourWidth), ceilTo(last.to, hourWidth)}}
	}
	inner, args := spanSQL(spans, "key, key2, requests, errors, cpu_ns, bytes_in, bytes_out, wall_ns", "request_rollup", "dim = ?", dim)
	if top <= 0 {
		top = math.MaxInt32 // no limit that both engines take
	}
	rows, err := g.db.DB.QueryContext(ctx, `SELECT key, key2, sum(requests), sum(errors), sum(cpu_ns), sum(bytes_in), sum(bytes_out),
		sum(wall_ns), count(*) OVER () FROM `+inner+` GROUP BY key, key2 ORDER BY 5 DESC, 3 DESC, 1, 2 LIMIT ?`, append(args, top)...)
	if err != nil {
		return Breakdown{}, err
	}
	defer rows.Close()
	var b Breakdown
	for rows.Next() {
		var c CostGroup
		var cpu, wall int64
		if err := rows.Scan(&c.Key, &c.Key2, &c.Requests, &c.Errors, &cpu, &c.BytesIn, &c.BytesOut, &wall, &b.All); err != nil {
			return Breakdown{}, err
		}
		c.CPU, c.Wall = time.Duration(cpu), time.Duration(wall)
		b.Groups = append(b.Groups, c)
	}
	return b, rows.Err()
}

// Costs sums the requests that started in [from, to): totals, the top
// groups by repo, user, kind and transport (same sums and order as
// Summarize), wall percentiles per kind, and a time series of about
// points steps. Every figure comes from the rollups: the cost does not
// grow with the number of records.
func (g *Governor) Costs(ctx context.Context, from, to time.Time, top, points int) (*Costs, error) {
	now := g.now()
	spans, f, t := window(from, to, now)
	c := &Costs{From: time.Unix(f, 0), To: time.Unix(t, 0), By: map[string]Breakdown{}}
	if len(spans) == 0 {
		return c, nil
	}
	total, err := g.breakdown(ctx, "", spans, 1)
	if err != nil {
		return nil, err
	}
	if len(total.Groups) > 0 {
		c.Total = total.Groups[0]
	}
	for _, dim := range CostDims {
		b, err := g.breakdown(ctx, dim, spans, top)
		if err != nil {
			return nil, err
		}
		c.By[dim] = b
	}
	if c.Walls, err = g.walls(ctx, spans); err != nil {
		return nil, err
	}
	if err := g.series(ctx, c, f, t, minuteFrom(now), points); err != nil {
		return nil, err
	}
	return c, nil
}

// walls reads the wall time histograms of the window and finds each kind's
// p50 and p95 by nearest rank, as Summarize does on the records.
func (g *Governor) walls(ctx context.Context, spans []span) ([]WallPercentiles, error) {
	inner, args := spanSQL(spans, "kind, bin, requests", "request_wall_bins", "1 = 1")
	rows, err := g.db.DB.QueryContext(ctx, "SELECT kind, bin, sum(requests) FROM "+inner+" GROUP BY kind, bin ORDER BY kind, bin", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	type bin struct{ bin, n int64 }
	hist := map[string][]bin{}
	var kinds []string
	for rows.Next() {
		var kind string
		var b bin
		if err := rows.Scan(&kind, &b.bin, &b.n); err != nil {
			return nil, err
		}
		if _, ok := hist[kind]; !ok {
			kinds = append(kinds, kind)
		}
		hist[kind] = append(hist[kind], b)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var out []WallPercentiles
	for _, kind := range kinds {
		bins := hist[kind]
		w := WallPercentiles{Kind: kind}
		for _, b := range bins {
			w.Requests += b.n
		}
		at := func(q float64) time.Duration {
			rank := int64(q*float64(w.Requests) + 0.999999) // nearest rank, 1-based
			rank = max(1, min(rank, w.Requests))
			var seen int64
			for _, b := range bins {
				if seen += b.n; seen >= rank {
					return binValue(b.bin)
				}
			}
			return 0
		}
		w.P50, w.P95 = at(0.50), at(0.95)
		out = append(out, w)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Requests > out[j].Requests })
	return out, nil
}

// steps are the series resolutions on offer; the finest that gives at most
// the asked number of points (and no finer than the buckets) is used.
var steps = []int64{60, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600, 7 * 24 * 3600}

func (g *Governor) series(ctx context.Context, c *Costs, f, t, minuteFrom int64, points int) error {
	if points <= 0 {
		points = 120
	}
	var spans []span
	if f < minuteFrom {
		spans = append(spans, span{hourWidth, f, min(t, minuteFrom)})
	}
	if t > minuteFrom {
		spans = append(spans, span{minuteWidth, max(f, minuteFrom), t})
	}
	step := steps[len(steps)-1]
	for _, s := range steps {
		if (t-f)/s <= int64(points) {
			step = s
			break
		}
	}
	if f < minuteFrom {
		step = max(step, hourWidth)
	}
	start := floorTo(f, step)
	n := int((t - start + step - 1) / step)
	c.Step = time.Duration(step) * time.Second
	c.Series = make([]CostPoint, n)
	for i := range c.Series {
		c.Series[i].Start = time.Unix(start+int64(i)*step, 0)
	}
	inner, args := spanSQL(spans, "bucket, requests, cpu_ns", "request_rollup", "dim = ''")
	rows, err := g.db.DB.QueryContext(ctx, "SELECT bucket, requests, cpu_ns FROM "+inner, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var bucket, requests, cpu int64
		if err := rows.Scan(&bucket, &requests, &cpu); err != nil {
			return err
		}
		if i := int((bucket - start) / step); i >= 0 && i < n {
			c.Series[i].Requests += requests
			c.Series[i].CPU += time.Duration(cpu)
		}
	}
	return rows.Err()
}

// LastPushes returns when each repository last received a push that ended
// well, from the push records (kept even after the records age out).
func (g *Governor) LastPushes(ctx context.Context) (map[string]time.Time, error) {
	rows, err := g.db.DB.QueryContext(ctx, "SELECT repo, start_ns FROM repo_last_push")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var repo string
		var ns int64
		if err := rows.Scan(&repo, &ns); err != nil {
			return nil, err
		}
		out[repo] = time.Unix(0, ns)
	}
	return out, rows.Err()
}

// trimRollups keeps the rollups in step with the records: minute buckets
// for MinuteRowsKept, hour buckets back to the hour of the oldest record
// left after retention (no records: none).
func trimRollups(ctx context.Context, tx *store.Tx, now time.Time) error {
	var oldest sql.NullInt64
	if err := tx.QueryRowContext(ctx, "SELECT min(start_ns) FROM requests").Scan(&oldest); err != nil {
		return err
	}
	cutoff := now.Unix()
	if oldest.Valid {
		cutoff = floorDiv(oldest.Int64, int64(time.Second))
	}
	hourCut := floorTo(cutoff, hourWidth)
	minuteCut := max(floorTo(cutoff, minuteWidth), now.Add(-MinuteRowsKept).Unix())
	for _, dim := range rollupDims {
		if _, err := tx.ExecContext(ctx, "DELETE FROM request_rollup WHERE width = ? AND dim = ? AND bucket < ?", hourWidth, dim, hourCut); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM request_rollup WHERE width = ? AND dim = ? AND bucket < ?", minuteWidth, dim, minuteCut); err != nil {
			return err
		}
	}
	for _, cut := range []struct{ width, before int64 }{{hourWidth, hourCut}, {minuteWidth, minuteCut}} {
		if _, err := tx.ExecContext(ctx, "DELETE FROM request_wall_bins WHERE width = ? AND bucket < ?", cut.width, cut.before); err != nil {
			return err
		}
	}
	return nil
}
