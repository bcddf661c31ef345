package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"packwire/internal/pgtest"
)

// TestPostgresPoolIsBounded: a PostgreSQL store opens at most
// DefaultMaxConns connections, or what SetMaxConns says; a query past the
// bound waits for one within its context. SQLite's pool is left as is.
func TestPostgresPoolIsBounded(t *testing.T) {
	ctx := context.Background()
	st, err := OpenPostgres(ctx, pgtest.Shared(t).NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.DB.Stats().MaxOpenConnections; got != DefaultMaxConns {
		t.Fatalf("max open connections %d, want %d", got, DefaultMaxConns)
	}
	st.DB.SetMaxConns(2)
	var held []*Tx
	defer func() {
		for _, tx := range held {
			tx.Rollback()
		}
	}()
	for range 2 {
		tx, err := st.DB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, tx)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := st.DB.ExecContext(short, "SELECT 1"); err == nil {
		t.Fatal("a third connection was opened past a bound of 2")
	}
	if s := st.DB.Stats(); s.OpenConnections != 2 {
		t.Fatalf("%d connections open, want 2", s.OpenConnections)
	}
	held[0].Rollback()
	if _, err := st.DB.ExecContext(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	lite, err := Open(ctx, filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	lite.DB.SetMaxConns(2)
	if got := lite.DB.Stats().MaxOpenConnections; got != 0 {
		t.Fatalf("SQLite's pool bounded to %d", got)
	}
}

// TestPostgresSessionsAreBounded: every session of a PostgreSQL pool has
// the idle-in-transaction, lock and statement timeouts (a paused node's
// transaction must not hold a row for ever; PostgreSQL's defaults are 0,
// none), a URL's own value kept.
func TestPostgresSessionsAreBounded(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Shared(t).NewDatabase(t)
	db, err := OpenPostgresPool(url, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for k, want := range map[string]string{"idle_in_transaction_session_timeout": "10s", "lock_timeout": "10s", "statement_timeout": "1min"} {
		var got string
		if err := db.QueryRowContext(ctx, "SHOW "+k).Scan(&got); err != nil || got != want {
			t.Errorf("%s = %q %v, want %q", k, got, err, want)
		}
	}
	own, err := OpenPostgresPool(url+"&lock_timeout=3s", "", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	var got string
	if err := own.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&got); err != nil || got != "3s" {
		t.Errorf("lock_timeout from the URL = %q %v, want 3s", got, err)
	}
	// A transaction left idle is ended by PostgreSQL, its row lock freed.
	db2, err := OpenPostgresPool(url+"&idle_in_transaction_session_timeout=300ms", "", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE held (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	db.ExecContext(ctx, "INSERT INTO held VALUES (1)")
	tx, err := db2.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SELECT id FROM held WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := db.ExecContext(short, "UPDATE held SET id = 1 WHERE id = 1"); err != nil {
		t.Fatalf("the row of an idle transaction was not freed: %v", err)
	}
}
