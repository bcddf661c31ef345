package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A PostgreSQL restarting refuses connections for a second or a few
// (shutting down, not listening, starting up). A statement that could
// not even connect is tried again, every reconnectEvery, within its
// context and for reconnectWithin at most: a request under way when
// PostgreSQL comes back goes on, instead of failing and having its
// client try again. Only a connection that was never made is retried:
// nothing of the statement reached PostgreSQL. reconnectWithin is short
// enough that a request making two store calls with PostgreSQL down
// (an SSH login, then its access) is still refused within 5 s.
const (
	reconnectEvery  = 100 * time.Millisecond
	reconnectWithin = 1500 * time.Millisecond
)

// notConnected tells whether err is a connection to PostgreSQL that could
// not be made (refused, or PostgreSQL not accepting: 57P03), or one
// database/sql found broken before using it.
func notConnected(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) || errors.Is(err, driver.ErrBadConn)
}

// reconnecting runs f, and again while it fails to connect, until ctx's
// deadline or reconnectWithin from now, whichever is first.
func (d *DB) reconnecting(ctx context.Context, f func() error) error {
	err := f()
	if d.Engine != Postgres || err == nil || !notConnected(err) {
		return err
	}
	until := time.Now().Add(reconnectWithin)
	if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
		until = dl
	}
	for notConnected(err) && time.Now().Add(reconnectEvery).Before(until) {
		select {
		case <-ctx.Done():
			return err
		case <-time.After(reconnectEvery):
		}
		err = f()
	}
	return err
}
