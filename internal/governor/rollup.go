package governor

import (
	"context"
	"fmt"
	"math"
	"time"

	"packwire/internal/store"
)

// rollupMigration is the fourth migration: per-bucket sums of the request
// records, so that a summary of any window costs a few thousand rows
// whatever the number of records (measured: over a million records in one
// day, a GROUP BY on the records themselves took 1.2-4.7 s even with a
// covering index; see TestCostsMillionRecords). The writer keeps them in the
// same transaction as the records; records written before this migration
// are summed once by backfillRollups (rollup_pending says it is due).
const rollupMigration = `
CREATE TABLE request_rollup (
	width     INTEGER NOT NULL, -- seconds a bucket spans: 60 or 3600
	dim       TEXT NOT NULL,    -- '' (every request), repo, user, kind, transport, pack_cache, repo_kind, node (migration 5)
	bucket    INTEGER NOT NULL, -- unix second the bucket starts (by request start)
	key       TEXT NOT NULL,
	key2      TEXT NOT NULL,    -- repo_kind: the kind ('' otherwise)
	requests  INTEGER NOT NULL,
	errors    INTEGER NOT NULL, -- result other than ok
	cpu_ns    INTEGER NOT NULL, -- git user + system CPU
	bytes_in  INTEGER NOT NULL,
	bytes_out INTEGER NOT NULL,
	wall_ns   INTEGER NOT NULL,
	PRIMARY KEY (width, dim, bucket, key, key2)
) WITHOUT ROWID;
CREATE TABLE request_wall_bins (
	width    INTEGER NOT NULL,
	bucket   INTEGER NOT NULL,
	kind     TEXT NOT NULL,
	bin      INTEGER NOT NULL, -- wallBin(wall_ns): 1/16-octave bins
	requests INTEGER NOT NULL,
	PRIMARY KEY (width, bucket, kind, bin)
) WITHOUT ROWID;
CREATE TABLE repo_last_push (
	repo     TEXT PRIMARY KEY,
	start_ns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE rollup_pending (since_ns INTEGER NOT NULL);
INSERT INTO rollup_pending SELECT coalesce(min(start_ns), 0) FROM requests;`

// Bucket widths of the rollups. Minute buckets make short windows exact to
// the minute and are kept for MinuteRowsKept; hour buckets cover the rest.
const (
	minuteWidth = 60
	hourWidth   = 3600
)

// MinuteRowsKept is how far back minute buckets are kept; older windows are
// summed from hour buckets (their edges rounded out to whole hours).
const MinuteRowsKept = 48 * time.Hour

// rollupDims are the dimensions summed; repo_kind (the request mix per
// repository) is kept by the hour only.
var rollupDims = []string{"", "repo", "user", "kind", "transport", "pack_cache", "repo_kind", "node"}

// binsPerOctave sets the resolution of the wall time histograms: a
// percentile read from them is within 2^(1/32)-1 = 2.2% of the exact one.
const binsPerOctave = 16

// wallBin is the histogram bin of a wall time; times under 1 ns share bin -1.
func wallBin(wall int64) int64 {
	if wall < 1 {
		return -1
	}
	return int64(math.Floor(math.Log2(float64(wall)) * binsPerOctave))
}

// binValue is the geometric middle of a bin: what a percentile in it reads as.
func binValue(bin int64) time.Duration {
	if bin < 0 {
		return 0
	}
	return time.Duration(math.Exp2((float64(bin) + 0.5) / binsPerOctave))
}

type sumKey struct {
	width, bucket  int64
	dim, key, key2 string
}

type binKey struct {
	width, bucket int64
	kind          string
	bin           int64
}

type rollupSums struct {
	requests, errors, cpu, bytesIn, bytesOut, wall int64
}

// rollups accumulates what a batch of records adds to the rollup tables.
type rollups struct {
	sums     map[sumKey]*rollupSums
	bins     map[binKey]int64
	lastPush map[string]int64
	horizon  int64 // unix second: minute buckets before it are not written
}

func newRollups(now time.Time) *rollups {
	return &rollups{sums: map[sumKey]*rollupSums{}, bins: map[binKey]int64{}, lastPush: map[string]int64{},
		horizon: now.Add(-MinuteRowsKept).Unix()}
}

// rollupInput is the part of a record the rollups need.
type rollupInput struct {
	startNs                                int64
	repo, user, kind, transport, packCache string
	node                                   string
	ok                                     bool
	cpu, bytesIn, bytesOut, wall           int64
}

func inputOf(r *Record) rollupInput {
	return rollupInput{startNs: r.Start.UnixNano(), repo: r.Repo, user: r.User, kind: r.Kind, transport: r.Transport,
		packCache: r.PackCache, node: r.Node, ok: !r.Failed(), cpu: int64(r.UserCPU + r.SysCPU), bytesIn: r.BytesIn,
		bytesOut: r.BytesOut, wall: int64(r.Wall)}
}

func (ru *rollups) add(in rollupInput) {
	sec := floorDiv(in.startNs, int64(time.Second))
	// A request one node relayed to another is recorded on both; the
	// serving node's record (where git ran) is the one every total counts.
	// The relaying node's stays in the node and pack_cache breakdowns,
	// where the relays' own load shows.
	relayed := in.packCache == PackCacheRelayed
	for _, width := range []int64{minuteWidth, hourWidth} {
		if width == minuteWidth && sec < ru.horizon {
			continue
		}
		bucket := floorDiv(sec, width) * width
		add := func(dim, key, key2 string) {
			k := sumKey{width: width, bucket: bucket, dim: dim, key: key, key2: key2}
			s := ru.sums[k]
			if s == nil {
				s = &rollupSums{}
				ru.sums[k] = s
			}
			s.requests++
			if !in.ok {
				s.errors++
			}
			s.cpu += in.cpu
			s.bytesIn += in.bytesIn
			s.bytesOut += in.bytesOut
			s.wall += in.wall
		}
		add("pack_cache", in.packCache, "")
		add("node", in.node, "")
		if relayed {
			continue
		}
		add("", "", "")
		add("repo", in.repo, "")
		add("user", in.user, "")
		add("kind", in.kind, "")
		add("transport", in.transport, "")
		if width == hourWidth {
			add("repo_kind", in.repo, in.kind)
		}
		ru.bins[binKey{width: width, bucket: bucket, kind: in.kind, bin: wallBin(in.wall)}]++
	}
	if !relayed && in.kind == "push" && in.ok && in.startNs > ru.lastPush[in.repo] {
		ru.lastPush[in.repo] = in.startNs
	}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// write adds the accumulated sums to the tables, inside tx. Each upsert
// adds to the row a bucket already has (PostgreSQL reads it under the row
// lock, so nodes writing the same minute add up); the old values are named
// by table, which PostgreSQL needs and SQLite accepts.
func (ru *rollups) write(ctx context.Context, tx *store.Tx) error {
	sums, err := tx.PrepareContext(ctx, `INSERT INTO request_rollup (width, dim, bucket, key, key2, requests, errors, cpu_ns, bytes_in, bytes_out, wall_ns)
		VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (width, dim, bucket, key, key2) DO UPDATE SET
		requests = request_rollup.requests + excluded.requests, errors = request_rollup.errors + excluded.errors,
		cpu_ns = request_rollup.cpu_ns + excluded.cpu_ns, bytes_in = request_rollup.bytes_in + excluded.bytes_in,
		bytes_out = request_rollup.bytes_out + excluded.bytes_out, wall_ns = request_rollup.wall_ns + excluded.wall_ns`)
	if err != nil {
		return err
	}
	defer sums.Close()
	bins, err := tx.PrepareContext(ctx, `INSERT INTO request_wall_bins (width, kind, bucket, bin, requests) VALUES (?,?,?,?,?)
		ON CONFLICT (width, bucket, kind, bin) DO UPDATE SET requests = request_wall_bins.requests + excluded.requests`)
	if err != nil {
		return err
	}
	defer bins.Close()
	for k, s := range ru.sums {
		if _, err := sums.ExecContext(ctx, k.width, k.dim, k.bucket, k.key, k.key2, s.requests, s.errors, s.cpu, s.bytesIn, s.bytesOut, s.wall); err != nil {
			return err
		}
	}
	for k, n := range ru.bins {
		if _, err := bins.ExecContext(ctx, k.width, k.kind, k.bucket, k.bin, n); err != nil {
			return err
		}
	}
	for repo, ns := range ru.lastPush {
		if _, err := tx.ExecContext(ctx, `INSERT INTO repo_last_push (repo, start_ns) VALUES (?, ?)
			ON CONFLICT (repo) DO UPDATE SET start_ns = excluded.start_ns WHERE excluded.start_ns > repo_last_push.start_ns`, repo, ns); err != nil {
			return err
		}
	}
	clear(ru.sums)
	clear(ru.bins)
	clear(ru.lastPush)
	return nil
}

// backfillRollups sums the records written before the rollups existed, in
// one transaction, reading the records once. It is a no-op when nothing is
// pending.
func (g *Governor) backfillRollups(ctx context.Context) error {
	var pending int
	if err := g.db.DB.QueryRowContext(ctx, "SELECT count(*) FROM rollup_pending").Scan(&pending); err != nil || pending == 0 {
		return err
	}
	tx, err := g.db.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := tx.Lock(ctx, writeLock); err != nil {
		return err
	}
	// Checked again inside the transaction (and, on PostgreSQL, under the
	// writers' lock): a server and a CLI, or two nodes, opening at once
	// must not both add the same records.
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM rollup_pending").Scan(&pending); err != nil || pending == 0 {
		return err
	}
	if err := sumRecordsInto(ctx, tx, time.Now()); err != nil {
		return fmt.Errorf("summing request records for the dashboard: %w", err)
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM rollup_pending"); err != nil {
		return err
	}
	return tx.Commit()
}

// backfillPage is how many records sumRecordsInto reads before it writes
// what it summed. A variable so a test can make pages small.
var backfillPage = 200_000

// sumRecordsInto adds every record to the rollups, a page at a time: the
// sums of each page are written once its rows are closed, which bounds the
// memory and is what PostgreSQL needs (one connection cannot write while a
// query's rows are still open on it). Pages follow (start_ns, id), which
// orders every record once.
func sumRecordsInto(ctx context.Context, tx *store.Tx, now time.Time) error {
	ru := newRollups(now)
	var afterStart int64 = math.MinInt64
	afterID := ""
	for {
		rows, err := tx.QueryContext(ctx, `SELECT id, start_ns, repo, "user", kind, transport, pack_cache, node, result IN ('ok', 'challenged'),
			cpu_user_ns + cpu_sys_ns, bytes_in, bytes_out, wall_ns FROM requests
			WHERE start_ns > ? OR (start_ns = ? AND id > ?) ORDER BY start_ns, id LIMIT ?`, afterStart, afterStart, afterID, backfillPage)
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			var in rollupInput
			if err := rows.Scan(&afterID, &in.startNs, &in.repo, &in.user, &in.kind, &in.transport, &in.packCache, &in.node, &in.ok,
				&in.cpu, &in.bytesIn, &in.bytesOut, &in.wall); err != nil {
				rows.Close()
				return err
			}
			afterStart = in.startNs
			ru.add(in)
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		// Sums add up, so each page's partial sums are written as they are.
		if err := ru.write(ctx, tx); err != nil {
			return err
		}
		if n < backfillPage {
			return nil
		}
	}
}
