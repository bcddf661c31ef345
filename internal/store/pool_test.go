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
	st, err := OpenPostgres(ctx, pgtest.Start(t).NewDatabase(t))
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
