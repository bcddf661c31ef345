package cluster

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"

	"packwire/internal/lab/netem"
	"packwire/internal/pgtest"
	"packwire/internal/store"
)

// placedAtZero places app on a, b and c (a primary), every copy made.
func placedAtZero(t *testing.T, db *store.DB) {
	t.Helper()
	ctx := context.Background()
	join(t, db, "a", "b", "c")
	if _, err := Place(ctx, db, "app", "", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if ok, err := SetReplicaGeneration(ctx, db, "app", n, 0, EmptyDigest); err != nil || !ok {
			t.Fatalf("copy on %s: %v %v", n, ok, err)
		}
	}
}

// TestPushTxnReadsReplicasOnceLocked: a push waiting for the row lock of
// the push before it reads the replicas as that push committed them
// (its lock, then its read, each statement a snapshot of its own), not
// as they were when it asked.
func TestPushTxnReadsReplicasOnceLocked(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	db := st.DB
	placedAtZero(t, db)
	first, err := BeginPush(ctx, db, "app", "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if first.Generation != 0 || len(first.Targets) != 2 {
		t.Fatalf("first push: generation %d, targets %+v", first.Generation, first.Targets)
	}
	second := make(chan *PushTxn, 1)
	go func() {
		p, err := BeginPush(ctx, db, "app", "a", time.Minute)
		if err != nil {
			t.Error(err)
		}
		second <- p
	}()
	time.Sleep(200 * time.Millisecond) // the second waits for the lock
	select {
	case <-second:
		t.Fatal("a second push began while the first held the row")
	default:
	}
	if err := first.Commit(ctx, []string{"b"}, ""); err != nil {
		t.Fatal(err)
	}
	if err := RecordCopy(ctx, db, "app", "a", 1, "", ""); err != nil {
		t.Fatal(err)
	}
	p := <-second
	if p == nil {
		return
	}
	defer p.Rollback()
	if p.Generation != 1 || len(p.Targets) != 1 || p.Targets[0].Node != "b" || p.Targets[0].Generation != 1 {
		t.Fatalf("second push: generation %d, targets %+v, skipped %v; want 1 and b at 1 (c was not a voter)", p.Generation, p.Targets, p.Skipped)
	}
}

// TestPushTxnRoundTrips: a push's transaction costs two round trips to
// PostgreSQL (BEGIN, the lock and the read in one; the commit and COMMIT
// in the other), not one a statement: each is on the push's path.
func TestPushTxnRoundTrips(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.Start(t).NewDatabase(t)
	st, err := store.OpenPostgres(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	placedAtZero(t, st.DB)

	u, _ := url.Parse(dbURL)
	proxy := &netem.Proxy{Upstream: u.Host}
	if u.Host, err = proxy.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	sdb, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdb.Close() })
	sdb.SetMaxOpenConns(1) // one connection: its statements prepared by the first push
	db := &store.DB{DB: sdb, Engine: store.Postgres}
	push := func(gen int64) int {
		before := proxy.Conns()
		p, err := BeginPush(ctx, db, "app", "a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Commit(ctx, []string{"b", "c"}, ""); err != nil {
			t.Fatal(err)
		}
		turns := netem.Delta(before, proxy.Conns()).Turns
		if err := RecordCopy(ctx, st.DB, "app", "a", gen, "", ""); err != nil {
			t.Fatal(err)
		}
		return turns
	}
	// The first push prepares the statements; the second pings the
	// connection (the driver does when it was idle for a second, and its
	// first reuse counts as such).
	push(1)
	push(2)
	if turns := push(3); turns != 2 {
		t.Fatalf("a push's transaction took %d round trips to PostgreSQL, want 2", turns)
	}
}
