package governor

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/store"
)

// FileName is the governor's database in the data directory. It is apart
// from packwire.db so that a flood of request records never contends with
// admin writes.
const FileName = "governor.db"

var migrations = []string{`
CREATE TABLE requests (
	seq         INTEGER PRIMARY KEY,
	id          TEXT NOT NULL UNIQUE,
	start_ns    INTEGER NOT NULL,
	transport   TEXT NOT NULL,
	protocol    INTEGER NOT NULL,
	repo        TEXT NOT NULL,
	"user"      TEXT NOT NULL, -- quoted: a reserved word in PostgreSQL
	remote      TEXT NOT NULL,
	service     TEXT NOT NULL,
	kind        TEXT NOT NULL,
	wants       INTEGER NOT NULL,
	haves       INTEGER NOT NULL,
	depth       INTEGER NOT NULL,
	filter      TEXT NOT NULL,
	pushed_refs INTEGER NOT NULL,
	bytes_in    INTEGER NOT NULL,
	bytes_out   INTEGER NOT NULL,
	queue_ns    INTEGER NOT NULL,
	wall_ns     INTEGER NOT NULL,
	cpu_user_ns INTEGER NOT NULL,
	cpu_sys_ns  INTEGER NOT NULL,
	max_rss     INTEGER NOT NULL,
	exit_code   INTEGER NOT NULL,
	result      TEXT NOT NULL,
	error       TEXT NOT NULL
);
CREATE INDEX requests_start ON requests(start_ns);`,
	`ALTER TABLE requests ADD COLUMN pack_cache TEXT NOT NULL DEFAULT '';`,
	maintenanceMigration, // 2: maintenance_runs (maintenance.go)
	rollupMigration,      // 3: per-bucket sums for the dashboard (rollup.go)
	// 4: the cluster node that served the request ("" on a single server).
	`ALTER TABLE requests ADD COLUMN node TEXT NOT NULL DEFAULT '';`,
	// 5: the rollups gain a node dimension (the Costs page of a cluster):
	// summed again from the records, once, by backfillRollups; and each
	// maintenance run says which node's copy it was.
	`DELETE FROM request_rollup;
DELETE FROM request_wall_bins;
DELETE FROM rollup_pending;
INSERT INTO rollup_pending SELECT coalesce(min(start_ns), 0) FROM requests;
ALTER TABLE maintenance_runs ADD COLUMN node TEXT NOT NULL DEFAULT '';`,
	// 6: relayed requests leave the totals (PackCacheRelayed): where a
	// store has any, its rollups are summed again, once.
	`DELETE FROM request_rollup WHERE EXISTS (SELECT 1 FROM requests WHERE pack_cache = 'relayed');
DELETE FROM request_wall_bins WHERE EXISTS (SELECT 1 FROM requests WHERE pack_cache = 'relayed');
INSERT INTO rollup_pending SELECT since FROM (SELECT coalesce(min(start_ns), 0) AS since FROM requests) AS oldest
	WHERE EXISTS (SELECT 1 FROM requests WHERE pack_cache = 'relayed') AND NOT EXISTS (SELECT 1 FROM rollup_pending);`,
	// 7: the packwire version that served the request ("" before this
	// migration): which build a change in costs came with.
	`ALTER TABLE requests ADD COLUMN version TEXT NOT NULL DEFAULT '';`,
}

// Schema is the PostgreSQL schema (namespace) the governor's tables live
// in when the store is in PostgreSQL: apart from the store's tables, with
// its own migration numbering (its own schema_version), and the same
// table names and queries as in governor.db.
const Schema = "packwire_governor"

// writeLock is the advisory lock key that serialises the transactions that
// write records and rollups on PostgreSQL (store.Tx.Lock). With it a
// record's seq is never below one a reader has already seen (tail and the
// API page by seq), and nodes upserting the same rollup rows never
// deadlock. 0x676f7665726e6f72: "governor".
const writeLock = 0x676f7665726e6f72

const columns = `seq, id, start_ns, transport, protocol, repo, "user", remote, service, kind, wants, haves, depth, filter,
	pushed_refs, bytes_in, bytes_out, queue_ns, wall_ns, cpu_user_ns, cpu_sys_ns, max_rss, exit_code, result, error, pack_cache, node, version`

// Options bound what the governor keeps and how it writes.
type Options struct {
	MaxAge        time.Duration // records older than this are trimmed; 0: keep
	MaxRows       int           // at most this many records are kept; 0: no bound
	FlushInterval time.Duration // batch writes at most this far apart (default 500ms)
	Log           *slog.Logger
	// Node names the cluster node in every record ("": a single server).
	Node string
	// Version is the packwire version written in every record (buildinfo).
	Version string
}

// Governor owns the request records.
type Governor struct {
	db      *store.Store
	opts    Options
	metrics *Metrics

	queue   chan Record
	wg      sync.WaitGroup
	stop    chan struct{}
	closeMu sync.Once

	clock func() time.Time // nil: time.Now; tests fix it

	retention atomic.Pointer[retention] // SetRetention's; nil: opts.MaxAge and opts.MaxRows
}

// retention is what Trim keeps: records newer than maxAge (0: any age),
// at most maxRows of them (0: no bound).
type retention struct {
	maxAge  time.Duration
	maxRows int
}

// SetRetention changes MaxAge and MaxRows while the governor runs (a
// configuration reload): the next Trim keeps to them.
func (g *Governor) SetRetention(maxAge time.Duration, maxRows int) {
	g.retention.Store(&retention{maxAge, maxRows})
}

func (g *Governor) retentionNow() retention {
	if r := g.retention.Load(); r != nil {
		return *r
	}
	return retention{g.opts.MaxAge, g.opts.MaxRows}
}

// now is the time windows and the rollups' minute horizon are reckoned from.
func (g *Governor) now() time.Time {
	if g.clock != nil {
		return g.clock()
	}
	return time.Now()
}

// Open opens (creating) the governor database at path. Queries work at once;
// Start begins accepting records (the server does, the CLI does not).
func Open(ctx context.Context, path string) (*Governor, error) {
	db, err := store.OpenWith(ctx, path, migrations)
	if err != nil {
		return nil, err
	}
	return open(ctx, db)
}

// MaxConns bounds the governor's own pool of PostgreSQL connections: its
// one batch writer, the retention loop and the dashboard's and the API's
// queries; more wait their turn. A node holds these besides its store's.
const MaxConns = 4

// OpenPostgres opens (creating) the governor's tables in the PostgreSQL
// database at databaseURL, in their own Schema: the records of every node
// of a cluster in one place. Its pool holds at most MaxConns connections.
func OpenPostgres(ctx context.Context, databaseURL string) (*Governor, error) {
	db, err := store.OpenPostgresSchema(ctx, databaseURL, Schema, migrations)
	if err != nil {
		return nil, err
	}
	db.DB.SetMaxConns(MaxConns)
	return open(ctx, db)
}

// OpenIn opens the governor where a data directory's store is: FileName in
// dir, or PostgreSQL when database is a postgres:// URL (a cluster).
func OpenIn(ctx context.Context, dir, database string) (*Governor, error) {
	if store.IsPostgresURL(database) {
		return OpenPostgres(ctx, database)
	}
	return Open(ctx, filepath.Join(dir, FileName))
}

func open(ctx context.Context, db *store.Store) (*Governor, error) {
	g := &Governor{db: db, metrics: newMetrics()}
	if err := g.backfillRollups(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return g, nil
}

// Start begins the batch writer and the retention loop.
func (g *Governor) Start(opts Options) {
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = 500 * time.Millisecond
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	g.opts = opts
	g.queue = make(chan Record, 4096)
	g.stop = make(chan struct{})
	g.wg.Add(1)
	go g.writer()
}

// Record accounts for one finished request: metrics at once, the database
// in the next batch. It blocks only if the writer is thousands of records
// behind, which is after the client has been answered.
func (g *Governor) Record(r Record) {
	g.metrics.observe(&r)
	if g.queue != nil {
		g.queue <- r
	}
}

// Close writes what is queued and closes the database.
func (g *Governor) Close() error {
	g.stopWriter()
	return g.db.Close()
}

// stopWriter writes what is queued and ends the writer; queries still work.
func (g *Governor) stopWriter() {
	g.closeMu.Do(func() {
		if g.stop != nil {
			close(g.stop)
			g.wg.Wait()
		}
	})
}

// maxUnwritten bounds the records kept for another try while the database
// cannot be written (PostgreSQL restarting, a full disk): some 25 MB.
const maxUnwritten = 50_000

// retryWait is how long the writer waits after a failed write before it
// tries again with the same records (and those that came meanwhile).
const retryWait = time.Second

func (g *Governor) writer() {
	defer g.wg.Done()
	// The flush timer runs only while records wait: an idle server's
	// writer sleeps until a record comes (or the minute's trim).
	flushAt := time.NewTimer(g.opts.FlushInterval)
	flushAt.Stop()
	armed := false
	arm := func(d time.Duration) {
		if !armed {
			flushAt.Reset(d)
			armed = true
		}
	}
	defer flushAt.Stop()
	trim := time.NewTicker(time.Minute)
	defer trim.Stop()
	var batch []Record
	var retryAt time.Time // after a failed write: not before this
	failures := 0         // writes failed in a row
	flush := func(final bool) {
		if len(batch) == 0 || (!final && time.Now().Before(retryAt)) {
			return
		}
		// After a failure the batch may have been committed all the same
		// (the connection lost while committing): the retry skips the
		// records already there.
		err := g.write(batch, failures > 0)
		if err == nil {
			if failures > 0 {
				g.opts.Log.Info("governor: request records written after failed tries", "records", len(batch), "tries", failures+1)
			}
			batch, failures, retryAt = batch[:0], 0, time.Time{}
			return
		}
		if failures == 0 || final {
			g.opts.Log.Error("governor: writing request records", "records", len(batch), "error", err.Error())
		}
		failures++
		retryAt = time.Now().Add(retryWait)
		switch {
		case final:
			g.opts.Log.Error("governor: request records lost at shutdown", "records", len(batch))
		case len(batch) > maxUnwritten:
			n := len(batch) - maxUnwritten
			g.opts.Log.Error("governor: request records dropped, the database could not be written", "records", n, "error", err.Error())
			batch = append(batch[:0], batch[n:]...)
		}
	}
	g.trim()
	for {
		select {
		case r := <-g.queue:
			batch = append(batch, r)
			if len(batch) >= 512 {
				flush(false)
			}
			if len(batch) > 0 {
				arm(max(g.opts.FlushInterval, time.Until(retryAt)))
			}
		case <-flushAt.C:
			armed = false
			flush(false)
			if len(batch) > 0 { // a failed write: try again after retryWait
				arm(max(g.opts.FlushInterval, time.Until(retryAt)))
			}
		case <-trim.C:
			g.trim()
		case <-g.stop:
			for {
				select {
				case r := <-g.queue:
					batch = append(batch, r)
				default:
					flush(true)
					return
				}
			}
		}
	}
}

func (g *Governor) insert(batch []Record) error { return g.write(batch, false) }

// write inserts a batch of records and adds them to the rollups, in one
// transaction; retry: leave out those already written.
func (g *Governor) write(batch []Record, retry bool) error {
	ctx := context.Background()
	tx, err := g.db.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := tx.Lock(ctx, writeLock); err != nil {
		return err
	}
	if retry {
		if batch, err = unwritten(ctx, tx, batch); err != nil {
			return err
		}
	}
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO requests (id, start_ns, transport, protocol, repo, "user", remote, service, kind,
		wants, haves, depth, filter, pushed_refs, bytes_in, bytes_out, queue_ns, wall_ns, cpu_user_ns, cpu_sys_ns, max_rss,
		exit_code, result, error, pack_cache, node, version) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	ru := newRollups(g.now())
	for _, r := range batch {
		if r.Node == "" {
			r.Node = g.opts.Node // set by Start, before the writer runs
		}
		if r.Version == "" {
			r.Version = g.opts.Version
		}
		ru.add(inputOf(&r))
		if _, err := stmt.ExecContext(ctx, r.ID, r.Start.UnixNano(), r.Transport, r.Protocol, r.Repo, r.User, r.Remote,
			r.Service, r.Kind, r.Wants, r.Haves, r.Depth, r.Filter, r.PushedRefs, r.BytesIn, r.BytesOut,
			int64(r.QueueWait), int64(r.Wall), int64(r.UserCPU), int64(r.SysCPU), r.MaxRSS, r.ExitCode, r.Result, r.Error, r.PackCache, r.Node, r.Version); err != nil {
			return err
		}
	}
	if err := ru.write(ctx, tx); err != nil {
		return err
	}
	return tx.Commit()
}

// unwritten returns the records of batch whose ids are not in the table.
func unwritten(ctx context.Context, tx *store.Tx, batch []Record) ([]Record, error) {
	written := map[string]bool{}
	for start := 0; start < len(batch); start += 500 {
		part := batch[start:min(start+500, len(batch))]
		args := make([]any, len(part))
		for i, r := range part {
			args[i] = r.ID
		}
		rows, err := tx.QueryContext(ctx, "SELECT id FROM requests WHERE id IN (?"+strings.Repeat(", ?", len(part)-1)+")", args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, err
			}
			written[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	if len(written) == 0 {
		return batch, nil
	}
	out := make([]Record, 0, len(batch)-len(written))
	for _, r := range batch {
		if !written[r.ID] {
			out = append(out, r)
		}
	}
	return out, nil
}

// trim applies the retention bounds.
func (g *Governor) trim() {
	if _, err := g.Trim(context.Background(), time.Now()); err != nil {
		g.opts.Log.Error("governor: retention", "error", err.Error())
	}
}

// Trim deletes records older than MaxAge before now and all but the newest
// MaxRows; it returns how many went. It is one transaction under the
// writers' lock: nodes of a cluster trimming the same tables take turns
// (the later finds little left), and never deadlock with a writer.
func (g *Governor) Trim(ctx context.Context, now time.Time) (int64, error) {
	tx, err := g.db.DB.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if err := tx.Lock(ctx, writeLock); err != nil {
		return 0, err
	}
	var total int64
	keep := g.retentionNow()
	if keep.maxAge > 0 {
		res, err := tx.ExecContext(ctx, "DELETE FROM requests WHERE start_ns < ?", now.Add(-keep.maxAge).UnixNano())
		if err != nil {
			return 0, err
		}
		n, _ := res.RowsAffected()
		total += n
	}
	if keep.maxRows > 0 {
		res, err := tx.ExecContext(ctx, `DELETE FROM requests WHERE seq <= (SELECT seq FROM requests ORDER BY seq DESC LIMIT 1 OFFSET ?)`, keep.maxRows)
		if err != nil {
			return 0, err
		}
		n, _ := res.RowsAffected()
		total += n
	}
	if err := trimRollups(ctx, tx, now); err != nil {
		return 0, err
	}
	return total, tx.Commit()
}

func scanRecords(rows *sql.Rows) ([]Record, int64, error) {
	defer rows.Close()
	var out []Record
	var lastSeq int64
	for rows.Next() {
		var r Record
		var startNs, queue, wall, cu, cs int64
		if err := rows.Scan(&lastSeq, &r.ID, &startNs, &r.Transport, &r.Protocol, &r.Repo, &r.User, &r.Remote, &r.Service,
			&r.Kind, &r.Wants, &r.Haves, &r.Depth, &r.Filter, &r.PushedRefs, &r.BytesIn, &r.BytesOut, &queue, &wall,
			&cu, &cs, &r.MaxRSS, &r.ExitCode, &r.Result, &r.Error, &r.PackCache, &r.Node, &r.Version); err != nil {
			return nil, 0, err
		}
		r.Start = time.Unix(0, startNs)
		r.QueueWait, r.Wall, r.UserCPU, r.SysCPU = Duration(queue), Duration(wall), Duration(cu), Duration(cs)
		out = append(out, r)
	}
	return out, lastSeq, rows.Err()
}

// Last returns the newest n records, oldest first.
func (g *Governor) Last(ctx context.Context, n int) ([]Record, error) {
	return g.LastWhere(ctx, n, Filter{})
}

// Filter narrows a query to some records; an empty field matches all.
type Filter struct {
	Node string // the cluster node that served them
}

// where is the filter as SQL conditions (each starting " AND ") and their
// arguments.
func (f Filter) where() (string, []any) {
	if f.Node == "" {
		return "", nil
	}
	return " AND node = ?", []any{f.Node}
}

// LastWhere returns the newest n records that pass f, oldest first.
func (g *Governor) LastWhere(ctx context.Context, n int, f Filter) ([]Record, error) {
	cond, args := f.where()
	rows, err := g.db.DB.QueryContext(ctx, "SELECT "+columns+" FROM (SELECT * FROM requests WHERE 1 = 1"+cond+" ORDER BY seq DESC LIMIT ?) AS newest ORDER BY seq",
		append(args, n)...)
	if err != nil {
		return nil, err
	}
	recs, _, err := scanRecords(rows)
	return recs, err
}

// After returns up to limit records written after sequence number seq, and
// the sequence number to continue from (for tail and the lab's API).
func (g *Governor) After(ctx context.Context, seq int64, since time.Time, limit int) ([]Record, int64, error) {
	rows, err := g.db.DB.QueryContext(ctx, "SELECT "+columns+" FROM requests WHERE seq > ? AND start_ns >= ? ORDER BY seq LIMIT ?", seq, since.UnixNano(), limit)
	if err != nil {
		return nil, seq, err
	}
	recs, last, err := scanRecords(rows)
	if len(recs) == 0 {
		last = seq
	}
	return recs, last, err
}

// LastSeq is the sequence number of the newest record (0 if none).
func (g *Governor) LastSeq(ctx context.Context) (int64, error) {
	var seq sql.NullInt64
	err := g.db.DB.QueryRowContext(ctx, "SELECT max(seq) FROM requests").Scan(&seq)
	return seq.Int64, err
}

// Group is one row of a summary.
type Group struct {
	Key         string        `json:"key"`
	Count       int64         `json:"count"`
	P50         time.Duration `json:"wall_p50_ns"`
	P95         time.Duration `json:"wall_p95_ns"`
	P99         time.Duration `json:"wall_p99_ns"`
	CPU         time.Duration `json:"cpu_total_ns"`
	CPUPerReq   time.Duration `json:"cpu_per_request_ns"`
	BytesOut    int64         `json:"bytes_out"`
	BytesPerReq int64         `json:"bytes_out_per_request"`
	Errors      int64         `json:"errors"`
}

// GroupBy names the columns a summary can group by.
// (user is quoted: a reserved word in PostgreSQL.)
var GroupBy = map[string]string{"repo": "repo", "user": `"user"`, "kind": "kind", "transport": "transport", "service": "service", "result": "result", "node": "node", "version": "version"}

// Summarize aggregates records since a time, grouped by one column, the
// groups with the most git CPU first. Counting and sums happen in SQL;
// each percentile is one indexed lookup.
func (g *Governor) Summarize(ctx context.Context, since time.Time, by string, top int) ([]Group, error) {
	return g.SummarizeWhere(ctx, since, by, top, Filter{})
}

// SummarizeWhere is Summarize over the records that pass f.
func (g *Governor) SummarizeWhere(ctx context.Context, since time.Time, by string, top int, f Filter) ([]Group, error) {
	cond, condArgs := f.where()
	col, ok := GroupBy[by]
	if !ok {
		return nil, fmt.Errorf("cannot group by %q (repo, user, kind, transport, service, result, node, version)", by)
	}
	if by != "node" && f.Node == "" {
		// Once per request: where it was served (PackCacheRelayed).
		cond += " AND pack_cache <> '" + PackCacheRelayed + "'"
	}
	// Ties are ordered by key, so that both engines answer alike.
	rows, err := g.db.DB.QueryContext(ctx, fmt.Sprintf(`SELECT %[1]s, count(*), sum(cpu_user_ns + cpu_sys_ns), sum(bytes_out),
		sum(CASE WHEN result IN ('ok', 'challenged') THEN 0 ELSE 1 END) FROM requests WHERE start_ns >= ?%[2]s GROUP BY %[1]s
		ORDER BY 3 DESC, 2 DESC, 1 LIMIT ?`, col, cond), append(append([]any{since.UnixNano()}, condArgs...), top)...)
	if err != nil {
		return nil, err
	}
	var groups []Group
	for rows.Next() {
		var gr Group
		var cpu int64
		if err := rows.Scan(&gr.Key, &gr.Count, &cpu, &gr.BytesOut, &gr.Errors); err != nil {
			rows.Close()
			return nil, err
		}
		gr.CPU = time.Duration(cpu)
		gr.CPUPerReq = gr.CPU / time.Duration(max(gr.Count, 1))
		gr.BytesPerReq = gr.BytesOut / max(gr.Count, 1)
		groups = append(groups, gr)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range groups {
		gr := &groups[i]
		for _, p := range []struct {
			q   float64
			out *time.Duration
		}{{0.50, &gr.P50}, {0.95, &gr.P95}, {0.99, &gr.P99}} {
			offset := int64(p.q*float64(gr.Count)+0.999999) - 1 // nearest rank
			offset = max(0, min(offset, gr.Count-1))
			var wall int64
			err := g.db.DB.QueryRowContext(ctx, fmt.Sprintf("SELECT wall_ns FROM requests WHERE start_ns >= ?%s AND %s = ? ORDER BY wall_ns LIMIT 1 OFFSET ?", cond, col),
				append(append([]any{since.UnixNano()}, condArgs...), gr.Key, offset)...).Scan(&wall)
			if err != nil {
				return nil, err
			}
			*p.out = time.Duration(wall)
		}
	}
	sort.SliceStable(groups, func(i, j int) bool { return groups[i].CPU > groups[j].CPU })
	return groups, nil
}
