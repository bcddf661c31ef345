package store

import (
	"context"
	"database/sql"
	"sync"
)

// versionWatch holds the connection that tells committed writes apart
// (Version). It is never used to write: SQLite's data_version counts the
// commits of *other* connections only.
type versionWatch struct {
	mu    sync.Mutex
	conn  *sql.Conn
	stmt  *sql.Stmt
	epoch int64 // connections opened: a new one counts data_version afresh
	// table: PostgreSQL's store has access_version (migration 9).
	table bool
}

// Version returns a number that differs from the one an earlier call
// returned whenever any write was committed to the store in between, by
// this process or another one (an admin command run while the server
// serves, another node of a cluster), to the tables that decide access
// (users, keys, tokens, grants, settings, anonymous reads, ref rules; on
// SQLite any table): so a value computed from those tables after Version
// returned v is current for as long as Version still returns v. ok is
// false where the store cannot tell (a PostgreSQL store of another
// schema): nothing may then be kept across calls.
//
// SQLite's PRAGMA data_version on a connection of its own: it reads the
// shared WAL index, no table, and changes on every commit by another
// connection. PostgreSQL's access_version row, which a trigger on each of
// those tables moves in the writing transaction: a change committed on
// any machine is seen by the very next call on every node, with no
// window (a notification could arrive after a request it should have
// stopped).
func (s *Store) Version(ctx context.Context) (v int64, ok bool, err error) {
	if s.DB.Engine != SQLite {
		if !s.version.table {
			return 0, false, nil
		}
		if err := s.DB.QueryRowContext(ctx, "SELECT version FROM access_version WHERE id = 1").Scan(&v); err != nil {
			return 0, false, err
		}
		return v, true, nil
	}
	w := &s.version
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stmt == nil {
		conn, err := s.DB.Conn(ctx)
		if err != nil {
			return 0, false, err
		}
		stmt, err := conn.PrepareContext(ctx, "PRAGMA data_version")
		if err != nil {
			conn.Close()
			return 0, false, err
		}
		w.conn, w.stmt = conn, stmt
		w.epoch++
	}
	// Not the caller's context: a client that hangs up mid-call must not
	// drop the connection, and with it everything kept at its version.
	if err := w.stmt.QueryRowContext(context.WithoutCancel(ctx)).Scan(&v); err != nil {
		// A broken connection is replaced on the next call.
		w.stmt.Close()
		w.conn.Close()
		w.conn, w.stmt = nil, nil
		return 0, false, err
	}
	return w.epoch<<40 + v, true, nil
}

// closeVersion gives the version connection back before the database closes.
func (s *Store) closeVersion() {
	w := &s.version
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stmt != nil {
		w.stmt.Close()
		w.conn.Close()
		w.conn, w.stmt = nil, nil
	}
}
