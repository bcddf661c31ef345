package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
)

// Engine is the database behind a store: SQLite (one box, a file in the
// data directory) or PostgreSQL (a cluster's shared state).
type Engine int

const (
	SQLite Engine = iota
	Postgres
)

func (e Engine) String() string {
	if e == Postgres {
		return "postgres"
	}
	return "sqlite"
}

// IsPostgresURL tells whether a --database value names PostgreSQL.
func IsPostgresURL(u string) bool {
	return strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://")
}

// DB is a database handle whose queries are written once, in the SQL both
// engines share, with "?" placeholders: for PostgreSQL it rewrites them to
// "$1, $2, ..." and passes booleans as 0/1 (the schema stores them as
// integers in both). Everything else of *sql.DB is as is.
type DB struct {
	*sql.DB
	Engine Engine
}

// Tx is a transaction of a DB, adapted the same way.
type Tx struct {
	*sql.Tx
	engine Engine
}

// ExecContext and QueryContext wait for a PostgreSQL restarting, a few
// seconds at most (reconnecting).
func (d *DB) ExecContext(ctx context.Context, q string, args ...any) (res sql.Result, err error) {
	err = d.reconnecting(ctx, func() error {
		res, err = d.DB.ExecContext(ctx, d.Engine.rebind(q), d.Engine.args(args)...)
		return err
	})
	return res, err
}

func (d *DB) QueryContext(ctx context.Context, q string, args ...any) (rows *sql.Rows, err error) {
	err = d.reconnecting(ctx, func() error {
		rows, err = d.DB.QueryContext(ctx, d.Engine.rebind(q), d.Engine.args(args)...)
		return err
	})
	return rows, err
}

func (d *DB) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return d.DB.QueryRowContext(ctx, d.Engine.rebind(q), d.Engine.args(args)...)
}

func (d *DB) Exec(q string, args ...any) (sql.Result, error) {
	return d.ExecContext(context.Background(), q, args...)
}

func (d *DB) Query(q string, args ...any) (*sql.Rows, error) {
	return d.QueryContext(context.Background(), q, args...)
}

func (d *DB) QueryRow(q string, args ...any) *sql.Row {
	return d.QueryRowContext(context.Background(), q, args...)
}

// BeginTx starts a transaction. On SQLite it takes the write lock at once
// (the DSN's _txlock=immediate), so a transaction that reads then writes
// never fails on another process's write.
func (d *DB) BeginTx(ctx context.Context, opts *sql.TxOptions) (*Tx, error) {
	var tx *sql.Tx
	err := d.reconnecting(ctx, func() (err error) {
		tx, err = d.DB.BeginTx(ctx, opts)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Tx{Tx: tx, engine: d.Engine}, nil
}

func (t *Tx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.Tx.ExecContext(ctx, t.engine.rebind(q), t.engine.args(args)...)
}

func (t *Tx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.Tx.QueryContext(ctx, t.engine.rebind(q), t.engine.args(args)...)
}

func (t *Tx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return t.Tx.QueryRowContext(ctx, t.engine.rebind(q), t.engine.args(args)...)
}

func (t *Tx) Exec(q string, args ...any) (sql.Result, error) {
	return t.ExecContext(context.Background(), q, args...)
}

// PrepareContext prepares a statement written with "?" placeholders, for a
// query run on every request (parsing it each time costs more than running
// it on SQLite). Its arguments are passed as they are: no booleans.
func (d *DB) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return d.DB.PrepareContext(ctx, d.Engine.rebind(q))
}

// PrepareContext prepares a statement written with "?" placeholders. Its
// arguments are passed as they are: no booleans.
func (t *Tx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return t.Tx.PrepareContext(ctx, t.engine.rebind(q))
}

// Lock serialises the transactions that lock the same key, until each
// ends: on PostgreSQL a transaction-level advisory lock (several nodes
// write the same tables); on SQLite nothing, since every transaction
// already holds the one write lock from its start (_txlock=immediate).
func (t *Tx) Lock(ctx context.Context, key int64) error {
	if t.engine != Postgres {
		return nil
	}
	_, err := t.Tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", key)
	return err
}

// rebind rewrites "?" placeholders outside string literals as "$n".
func (e Engine) rebind(q string) string {
	if e != Postgres || !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 8)
	n, quoted := 0, false
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'':
			quoted = !quoted
		case c == '?' && !quoted:
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// args passes booleans as 0/1: the schema keeps them in integer columns,
// which SQLite's driver does by itself and pgx refuses.
func (e Engine) args(args []any) []any {
	if e != Postgres {
		return args
	}
	var out []any
	for i, a := range args {
		if b, ok := a.(bool); ok {
			if out == nil {
				out = append([]any(nil), args...)
			}
			out[i] = boolInt(b)
		}
	}
	if out == nil {
		return args
	}
	return out
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

var (
	ddlIntegerKey = regexp.MustCompile(`\bINTEGER PRIMARY KEY\b`)
	ddlInteger    = regexp.MustCompile(`\bINTEGER\b`)
	ddlBlob       = regexp.MustCompile(`\bBLOB\b`)
	ddlWithout    = regexp.MustCompile(`\)\s*WITHOUT ROWID\b`)
)

// ddl adapts a migration written for SQLite: an INTEGER PRIMARY KEY is
// SQLite's rowid alias (assigned on insert), an identity column in
// PostgreSQL; INTEGER is 64 bits in SQLite (times are unix nanoseconds),
// BIGINT in PostgreSQL; BLOB is BYTEA; WITHOUT ROWID (a SQLite table kept
// in its primary key's order) has no equivalent, nor needs one.
//
// A migration's part after postgresOnly is PostgreSQL's alone, and its
// part after sqliteOnly (and before postgresOnly) SQLite's.
func (e Engine) ddl(q string) string {
	q, pgPart, _ := strings.Cut(q, postgresOnly)
	q, sqlitePart, _ := strings.Cut(q, sqliteOnly)
	if e != Postgres {
		return q + sqlitePart
	}
	q += pgPart
	q = ddlWithout.ReplaceAllString(q, ")")
	q = ddlIntegerKey.ReplaceAllString(q, "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
	q = ddlInteger.ReplaceAllString(q, "BIGINT")
	return ddlBlob.ReplaceAllString(q, "BYTEA")
}

// isUnique tells whether err is a unique or primary key violation, in
// either engine's words.
func isUnique(err error) bool {
	if err == nil {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "23505"
	}
	return strings.Contains(err.Error(), "UNIQUE constraint failed") ||
		strings.Contains(err.Error(), "constraint failed: PRIMARY KEY")
}

// IsUnique tells whether err is a unique or primary key violation, for
// packages that write their own rows (the cluster's).
func IsUnique(err error) bool { return isUnique(err) }
