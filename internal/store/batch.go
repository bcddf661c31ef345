package store

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// Conn is one connection of a DB, held by its caller: a transaction
// driven by hand (BEGIN ... COMMIT among its statements), whose
// statements go in batches, each batch in one round trip to PostgreSQL.
// A transaction left open when it is closed (a batch failed, its context
// ended) is not reused: the driver discards a connection in a
// transaction when the pool hands it out again.
type Conn struct {
	c      *sql.Conn
	engine Engine
}

// Pin takes a connection from the pool for the caller alone, until Close.
func (d *DB) Pin(ctx context.Context) (*Conn, error) {
	var c *sql.Conn
	err := d.reconnecting(ctx, func() (err error) {
		c, err = d.DB.Conn(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, engine: d.Engine}, nil
}

// Close gives the connection back to the pool.
func (c *Conn) Close() error { return c.c.Close() }

// Statement is one statement of a batch, written with "?" placeholders
// (as DB's). Row, if set, is called for each row it returns, with the
// row's Scan.
type Statement struct {
	Query string
	Args  []any
	Row   func(scan func(dest ...any) error) error
}

// Batch runs the statements in order. On PostgreSQL they are sent at once
// and answered at once (a pipeline: one round trip); the first that fails
// ends the batch (PostgreSQL skips the others) and its error is returned.
// On SQLite they run one after the other.
func (c *Conn) Batch(ctx context.Context, stmts ...Statement) error {
	if c.engine != Postgres {
		for _, s := range stmts {
			if err := c.sqliteOne(ctx, s); err != nil {
				return err
			}
		}
		return nil
	}
	return c.c.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return errors.New("store: not a pgx connection")
		}
		b := &pgx.Batch{}
		for _, s := range stmts {
			b.Queue(c.engine.rebind(s.Query), c.engine.args(s.Args)...)
		}
		br := sc.Conn().SendBatch(ctx, b)
		for _, s := range stmts {
			rows, err := br.Query()
			if err == nil {
				err = eachRow(rows, s.Row)
				rows.Close()
				if err == nil {
					err = rows.Err() // set by Close when the statement failed late
				}
			}
			if err != nil {
				br.Close()
				return err
			}
		}
		return br.Close()
	})
}

// rowSource is what Batch reads rows from: pgx's rows or database/sql's.
type rowSource interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// eachRow calls row (if set) for each row of rows, and returns the rows' error.
func eachRow(rows rowSource, row func(scan func(dest ...any) error) error) error {
	for rows.Next() {
		if row != nil {
			if err := row(rows.Scan); err != nil {
				return err
			}
		}
	}
	return rows.Err()
}

func (c *Conn) sqliteOne(ctx context.Context, s Statement) error {
	rows, err := c.c.QueryContext(ctx, s.Query, c.engine.args(s.Args)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	return eachRow(rows, s.Row)
}
