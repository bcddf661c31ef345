package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// outboxMigration is migration 5: webhooks, and the outbox that
// internal/outbox delivers from. A delivery is one payload for one target
// (a webhook, a push mirror); each attempt at it is kept with its status,
// error and latency. Pending rows are what survives a restart.
const outboxMigration = `
CREATE TABLE hooks (
	id           INTEGER PRIMARY KEY,
	repo_pattern TEXT NOT NULL,
	url          TEXT NOT NULL,
	secret       TEXT NOT NULL DEFAULT '',
	events       TEXT NOT NULL,
	created      INTEGER NOT NULL
);
CREATE TABLE deliveries (
	id          INTEGER PRIMARY KEY,
	guid        TEXT NOT NULL UNIQUE,
	kind        TEXT NOT NULL,
	target      TEXT NOT NULL,
	repo        TEXT NOT NULL,
	event       TEXT NOT NULL,
	payload     BLOB NOT NULL,
	created_ms  INTEGER NOT NULL,
	state       TEXT NOT NULL DEFAULT 'pending',
	attempts    INTEGER NOT NULL DEFAULT 0,
	next_ms     INTEGER NOT NULL,
	last_status INTEGER NOT NULL DEFAULT 0,
	last_error  TEXT NOT NULL DEFAULT '',
	finished_ms INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX deliveries_due ON deliveries(next_ms) WHERE state = 'pending';
CREATE INDEX deliveries_target ON deliveries(kind, target, id);
CREATE INDEX deliveries_finished ON deliveries(finished_ms) WHERE state <> 'pending';
CREATE TABLE delivery_attempts (
	delivery_id INTEGER NOT NULL REFERENCES deliveries(id) ON DELETE CASCADE,
	attempt     INTEGER NOT NULL,
	start_ms    INTEGER NOT NULL,
	latency_ns  INTEGER NOT NULL,
	status      INTEGER NOT NULL,
	error       TEXT NOT NULL,
	PRIMARY KEY (delivery_id, attempt)
);`

// hookIDsMigration is migration 12: a hook's id is never given to
// another. SQLite's INTEGER PRIMARY KEY takes the largest id in use plus
// one, so after the newest hook was removed the next took its id, and
// "hook deliveries N" listed the removed hook's deliveries as the new
// one's; AUTOINCREMENT never goes back (the table is rebuilt to get it).
// Its counter starts past every id a delivery still names, so ids removed
// before this migration are not reused either. PostgreSQL's identity
// column is a sequence, which never went back.
const hookIDsMigration = sqliteOnly + `
CREATE TABLE hooks_autoincrement (
	id           INTEGER PRIMARY KEY AUTOINCREMENT,
	repo_pattern TEXT NOT NULL,
	url          TEXT NOT NULL,
	secret       TEXT NOT NULL DEFAULT '',
	events       TEXT NOT NULL,
	created      INTEGER NOT NULL
);
INSERT INTO hooks_autoincrement(id, repo_pattern, url, secret, events, created)
	SELECT id, repo_pattern, url, secret, events, created FROM hooks;
DROP TABLE hooks;
ALTER TABLE hooks_autoincrement RENAME TO hooks;
INSERT INTO sqlite_sequence(name, seq) SELECT 'hooks', 0
	WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'hooks');
UPDATE sqlite_sequence SET seq = max(seq,
	(SELECT coalesce(max(CAST(target AS INTEGER)), 0) FROM deliveries WHERE kind = 'webhook'))
	WHERE name = 'hooks';`

// Delivery states.
const (
	DeliveryPending   = "pending"   // waiting for its first attempt or a retry
	DeliveryDelivered = "delivered" // an attempt succeeded (or a later one covered it)
	DeliveryFailed    = "failed"    // given up: too old, too many attempts, or its target removed
)

// Delivery kinds: who sends a delivery.
const (
	KindWebhook    = "webhook"     // target: the hook's id
	KindPushMirror = "push-mirror" // target: "REPO#ID"
)

// NewDelivery is a payload to queue for one target.
type NewDelivery struct {
	Kind    string // KindWebhook, KindPushMirror
	Target  string // which one of that kind: a hook id, "team/app#1"
	Repo    string
	Event   string
	Payload []byte
}

// Delivery is a queued payload with where it stands.
type Delivery struct {
	ID          int64     `json:"id"`
	GUID        string    `json:"guid"` // the X-Packwire-Delivery header: the same on every attempt
	Kind        string    `json:"kind"`
	Target      string    `json:"target"`
	Repo        string    `json:"repo"`
	Event       string    `json:"event"`
	Payload     []byte    `json:"-"`
	Created     time.Time `json:"created"`
	State       string    `json:"state"`
	Attempts    int       `json:"attempts"`
	NextAttempt time.Time `json:"next_attempt,omitzero"`
	LastStatus  int       `json:"last_status,omitempty"`
	LastError   string    `json:"last_error,omitempty"`
	Finished    time.Time `json:"finished,omitzero"`
	// LastLatency is how long the last attempt took (0: none yet).
	LastLatency time.Duration `json:"last_latency_ns,omitempty"`
}

// Attempt is one try at a delivery.
type Attempt struct {
	Number  int           `json:"attempt"`
	Start   time.Time     `json:"start"`
	Latency time.Duration `json:"latency_ns"`
	Status  int           `json:"status,omitempty"` // HTTP status; 0: none (no answer, or not HTTP)
	Error   string        `json:"error,omitempty"`  // empty: it succeeded
}

// Outcome is where a delivery stands after an attempt.
type Outcome struct {
	State string    // DeliveryPending (retry at Next), DeliveryDelivered or DeliveryFailed
	Next  time.Time // the retry, for DeliveryPending
}

// EnqueueDeliveries queues payloads in one INSERT statement: a push's
// request path pays one small write whatever the number of targets.
func (s *Store) EnqueueDeliveries(ctx context.Context, ds []NewDelivery) error {
	if len(ds) == 0 {
		return nil
	}
	ms := time.Now().UnixMilli()
	var q strings.Builder
	q.WriteString("INSERT INTO deliveries(guid, kind, target, repo, event, payload, created_ms, next_ms) VALUES ")
	args := make([]any, 0, 8*len(ds))
	for i, d := range ds {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?, ?, ?, ?, ?, ?)")
		args = append(args, newGUID(), d.Kind, d.Target, d.Repo, d.Event, d.Payload, ms, ms)
	}
	_, err := s.DB.ExecContext(ctx, q.String(), args...)
	return err
}

// newGUID is a random UUID (version 4), as delivery ids are usually spelled.
func newGUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

const deliveryColumns = `id, guid, kind, target, repo, event, payload, created_ms, state, attempts, next_ms, last_status, last_error, finished_ms,
	COALESCE((SELECT latency_ns FROM delivery_attempts a WHERE a.delivery_id = deliveries.id ORDER BY attempt DESC LIMIT 1), 0)`

func scanDelivery(row interface{ Scan(...any) error }) (Delivery, error) {
	var d Delivery
	var created, next, finished, latency int64
	if err := row.Scan(&d.ID, &d.GUID, &d.Kind, &d.Target, &d.Repo, &d.Event, &d.Payload, &created, &d.State, &d.Attempts,
		&next, &d.LastStatus, &d.LastError, &finished, &latency); err != nil {
		return Delivery{}, err
	}
	d.LastLatency = time.Duration(latency)
	d.Created = time.UnixMilli(created)
	if next > 0 {
		d.NextAttempt = time.UnixMilli(next)
	}
	if finished > 0 {
		d.Finished = time.UnixMilli(finished)
	}
	return d, nil
}

func (s *Store) queryDeliveries(ctx context.Context, q string, args ...any) ([]Delivery, error) {
	rows, err := s.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ds []Delivery
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			return nil, err
		}
		ds = append(ds, d)
	}
	return ds, rows.Err()
}

// DueDeliveries returns, for each target with a delivery due at now, its
// oldest due one, soonest due first: a target with a backlog never hides
// the others.
//
// A push mirror's candidate is its oldest pending delivery, due or not:
// while one is claimed (an attempt in flight on any node of a cluster,
// its next attempt moved past the claim's end) or waiting for its retry,
// none of the target's newer ones is due, so two nodes never push to one
// mirror at once (the attempt sends the whole repository and covers the
// newer ones). A webhook's newer delivery does not wait behind an older
// one's retry.
func (s *Store) DueDeliveries(ctx context.Context, now time.Time, limit int) ([]Delivery, error) {
	ms := now.UnixMilli()
	return s.queryDeliveries(ctx, `SELECT `+deliveryColumns+` FROM deliveries WHERE id IN (
		SELECT min(id) FROM deliveries WHERE state = 'pending' AND (next_ms <= ? OR kind = ?) GROUP BY kind, target)
		AND next_ms <= ? ORDER BY next_ms, id LIMIT ?`, ms, KindPushMirror, ms, limit)
}

// NextDue is when the next pending delivery is due (zero: none pending).
func (s *Store) NextDue(ctx context.Context) (time.Time, error) {
	var next sql.NullInt64
	err := s.DB.QueryRowContext(ctx, "SELECT min(next_ms) FROM deliveries WHERE state = 'pending'").Scan(&next)
	if err != nil || !next.Valid {
		return time.Time{}, err
	}
	return time.UnixMilli(next.Int64), nil
}

// LastPendingID is the newest pending delivery of a target (0: none).
func (s *Store) LastPendingID(ctx context.Context, kind, target string) (int64, error) {
	var id sql.NullInt64
	err := s.DB.QueryRowContext(ctx, "SELECT max(id) FROM deliveries WHERE kind = ? AND target = ? AND state = 'pending'", kind, target).Scan(&id)
	return id.Int64, err
}

// RecordAttempt stores an attempt at delivery d and where d stands after it,
// in one transaction.
func (s *Store) RecordAttempt(ctx context.Context, d Delivery, a Attempt, o Outcome) error {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO delivery_attempts(delivery_id, attempt, start_ms, latency_ns, status, error) VALUES(?, ?, ?, ?, ?, ?)",
		d.ID, a.Number, a.Start.UnixMilli(), int64(a.Latency), a.Status, a.Error); err != nil {
		return err
	}
	var next, finished int64
	switch o.State {
	case DeliveryPending:
		next = o.Next.UnixMilli()
	default:
		finished = time.Now().UnixMilli()
	}
	if _, err := tx.ExecContext(ctx, "UPDATE deliveries SET attempts = ?, state = ?, next_ms = ?, last_status = ?, last_error = ?, finished_ms = ? WHERE id = ?",
		a.Number, o.State, next, a.Status, a.Error, finished, d.ID); err != nil {
		return err
	}
	return tx.Commit()
}

// CoverDeliveries marks a target's pending deliveries up to id upTo as
// delivered by delivery by: for targets where one successful attempt
// sends everything queued before it (a push mirror pushes every ref).
func (s *Store) CoverDeliveries(ctx context.Context, kind, target string, upTo, by int64) (int64, error) {
	res, err := s.DB.ExecContext(ctx, `UPDATE deliveries SET state = 'delivered', finished_ms = ?, last_error = ?
		WHERE kind = ? AND target = ? AND state = 'pending' AND id <= ? AND id <> ?`,
		time.Now().UnixMilli(), fmt.Sprintf("covered by delivery %d", by), kind, target, upTo, by)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// AbandonDeliveries gives up a target's pending deliveries (its webhook or
// push mirror was removed).
func (s *Store) AbandonDeliveries(ctx context.Context, kind, target, reason string) error {
	return abandon(ctx, s.DB, kind, target, reason)
}

func abandon(ctx context.Context, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, kind, target, reason string) error {
	_, err := db.ExecContext(ctx, `UPDATE deliveries SET state = 'failed', finished_ms = ?, last_error = ?
		WHERE kind = ? AND target = ? AND state = 'pending'`, time.Now().UnixMilli(), reason, kind, target)
	return err
}

// DeliveryFilter selects deliveries to list.
type DeliveryFilter struct {
	Kind   string // "": every kind
	Target string // "": every target
	Repo   string // "": every repository
	Limit  int    // newest first; 0: 50
}

// Deliveries lists deliveries, newest first.
func (s *Store) Deliveries(ctx context.Context, f DeliveryFilter) ([]Delivery, error) {
	var where []string
	var args []any
	for _, c := range []struct{ col, v string }{{"kind", f.Kind}, {"target", f.Target}, {"repo", f.Repo}} {
		if c.v != "" {
			where = append(where, c.col+" = ?")
			args = append(args, c.v)
		}
	}
	q := "SELECT " + deliveryColumns + " FROM deliveries"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	if f.Limit <= 0 {
		f.Limit = 50
	}
	return s.queryDeliveries(ctx, q+" ORDER BY id DESC LIMIT ?", append(args, f.Limit)...)
}

// ClaimDelivery takes d for one attempt if it is still as read (pending,
// due, with the same number of attempts): its next attempt moves to until,
// so that no other loop (another node of a cluster) takes it meanwhile;
// RecordAttempt then sets what follows. A delivery whose claimer died is
// due again at until. It reports whether d was taken.
func (s *Store) ClaimDelivery(ctx context.Context, d Delivery, now, until time.Time) (bool, error) {
	res, err := s.DB.ExecContext(ctx, "UPDATE deliveries SET next_ms = ? WHERE id = ? AND state = 'pending' AND attempts = ? AND next_ms <= ?",
		until.UnixMilli(), d.ID, d.Attempts, now.UnixMilli())
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// GetDelivery returns one delivery by id, or ErrNotFound.
func (s *Store) GetDelivery(ctx context.Context, id int64) (Delivery, error) {
	d, err := scanDelivery(s.DB.QueryRowContext(ctx, "SELECT "+deliveryColumns+" FROM deliveries WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return Delivery{}, fmt.Errorf("delivery %d: %w", id, ErrNotFound)
	}
	return d, err
}

// Attempts returns a delivery's attempts in order.
func (s *Store) Attempts(ctx context.Context, deliveryID int64) ([]Attempt, error) {
	rows, err := s.DB.QueryContext(ctx, "SELECT attempt, start_ms, latency_ns, status, error FROM delivery_attempts WHERE delivery_id = ? ORDER BY attempt", deliveryID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var as []Attempt
	for rows.Next() {
		var a Attempt
		var start, latency int64
		if err := rows.Scan(&a.Number, &start, &latency, &a.Status, &a.Error); err != nil {
			return nil, err
		}
		a.Start, a.Latency = time.UnixMilli(start), time.Duration(latency)
		as = append(as, a)
	}
	return as, rows.Err()
}

// TrimDeliveries removes finished deliveries (and their attempts) that
// finished before the given time.
func (s *Store) TrimDeliveries(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.DB.ExecContext(ctx, "DELETE FROM deliveries WHERE state <> 'pending' AND finished_ms < ?", before.UnixMilli())
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
