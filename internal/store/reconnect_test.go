package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestReconnectingWaitsOutARestart: a statement that cannot connect
// (PostgreSQL restarting) is tried again until it connects, within
// reconnectWithin; any other error, and a statement that reached
// PostgreSQL, is returned at once, never run twice.
func TestReconnectingWaitsOutARestart(t *testing.T) {
	d := &DB{Engine: Postgres}
	refused := &pgconn.ConnectError{}
	calls := 0
	err := d.reconnecting(context.Background(), func() error {
		calls++
		if calls < 4 {
			return refused
		}
		return nil
	})
	if err != nil || calls != 4 {
		t.Fatalf("a statement connecting on its 4th try: %v after %d tries, want nil after 4", err, calls)
	}

	other := errors.New("ERROR: duplicate key (SQLSTATE 23505)")
	calls = 0
	if err := d.reconnecting(context.Background(), func() error { calls++; return other }); err != other || calls != 1 {
		t.Fatalf("a statement PostgreSQL refused: %v after %d tries, want it at once", err, calls)
	}

	calls = 0
	start := time.Now()
	err = d.reconnecting(context.Background(), func() error { calls++; return refused })
	if took := time.Since(start); !errors.As(err, &refused) || took > reconnectWithin+time.Second {
		t.Fatalf("PostgreSQL down: %v after %s (%d tries), want the connect error within %s", err, took, calls, reconnectWithin)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	calls = 0
	d.reconnecting(ctx, func() error { calls++; return refused })
	if calls > 3 {
		t.Fatalf("%d tries within a 250 ms deadline, want the deadline kept (tries every %s)", calls, reconnectEvery)
	}

	sqlite := &DB{Engine: SQLite}
	calls = 0
	sqlite.reconnecting(context.Background(), func() error { calls++; return refused })
	if calls != 1 {
		t.Fatalf("SQLite: %d tries, want 1", calls)
	}
}

// TestReconnectingKnowsARefusedConnection: pgx's error for a PostgreSQL
// not listening (as during a restart) is one reconnecting tries again.
func TestReconnectingKnowsARefusedConnection(t *testing.T) {
	d, err := OpenPostgresPool("postgres://packwire@127.0.0.1:1/none?sslmode=disable", "", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	start := time.Now()
	_, err = d.ExecContext(context.Background(), "SELECT 1")
	if took := time.Since(start); !notConnected(err) || took < reconnectWithin-2*reconnectEvery {
		t.Fatalf("PostgreSQL not listening: %v (connect error: %v) after %s, want it tried again for %s", err, notConnected(err), took, reconnectWithin)
	}
}
