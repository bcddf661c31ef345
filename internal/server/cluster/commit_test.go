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

// TestPushTxnReadsReplicasOnceLocked: a push waiting for the turn of
// the push before it reads the replicas as that push committed them
// (its claim, then its read, each statement a snapshot of its own), not
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
		t.Fatal("a second push began while the first held the turn")
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

// TestPushTxnRoundTrips: a push costs two round trips to PostgreSQL (the
// claim of its turn with the read, one transaction, in one; the commit,
// one statement, in the other), not one a statement: each is on the
// push's path.
func TestPushTxnRoundTrips(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.Shared(t).NewDatabase(t)
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

// TestPushTurnDoesNotHoldFailoverUp: a push between its claim and its
// commit (replicating, or its primary paused there) holds no row lock and
// no transaction: its primary's node silent, the monitor promotes at
// once, the new primary's push takes the turn at once, and the old
// primary's push, when it commits, is refused and records nothing. A
// move of a copy takes the turn away too.
func TestPushTurnDoesNotHoldFailoverUp(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = 300 * time.Millisecond
	nodes := join(t, db, "a", "b", "c")
	if _, err := Place(ctx, db, "app", "", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if ok, err := SetReplicaGeneration(ctx, db, "app", n, 0, EmptyDigest); err != nil || !ok {
			t.Fatalf("copy on %s: %v %v", n, ok, err)
		}
	}
	old, err := BeginPush(ctx, db, "app", "a", timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Rollback()
	var idle int
	if err := db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'").Scan(&idle); err != nil || idle != 0 {
		t.Fatalf("%d sessions idle in a transaction during a push (%v), want none", idle, err)
	}
	time.Sleep(timeout + 100*time.Millisecond)
	nodes[1].beat(ctx, ctx) // a is silent, b and c healthy
	nodes[2].beat(ctx, ctx)
	check, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	got, err := Failover(check, db, timeout)
	if err != nil || len(got) != 1 || got[0].From != "a" {
		t.Fatalf("failover with a's push in flight: %+v %v, want app promoted away from a at once", got, err)
	}
	next, err := BeginPush(check, db, "app", got[0].To, timeout)
	if err != nil {
		t.Fatalf("the new primary's push: %v", err)
	}
	if err := old.Commit(ctx, []string{"b", "c"}, ""); err == nil {
		t.Fatal("the old primary's push committed after a failover")
	}
	if err := next.Commit(ctx, nil, ""); err != nil {
		t.Fatalf("the new primary's push: %v", err)
	}
	var gen int64
	if err := db.QueryRow("SELECT generation FROM cluster_repos WHERE name = 'app'").Scan(&gen); err != nil || gen != 1 {
		t.Fatalf("generation %d %v, want 1 (the new primary's push alone)", gen, err)
	}
	var marked int
	db.QueryRow("SELECT count(*) FROM replicas WHERE repo = 'app' AND generation = 1").Scan(&marked)
	if marked != 0 {
		t.Fatalf("%d copies recorded at generation 1 (the new primary's own is recorded once git wrote it; no voters)", marked)
	}

	// A copy added meanwhile waits for the push in flight; one stuck past
	// pushWait has its turn taken away, and is refused.
	primary := got[0].To
	if err := RecordCopy(ctx, db, "app", primary, 1, "", ""); err != nil {
		t.Fatal(err)
	}
	p, err := BeginPush(ctx, db, "app", primary, timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Rollback()
	nodes[0].beat(ctx, ctx)
	added := make(chan error, 1)
	go func() {
		_, err := AddCopy(ctx, db, "app", "a", time.Minute)
		added <- err
	}()
	time.Sleep(200 * time.Millisecond) // AddCopy waits for the push
	select {
	case err := <-added:
		t.Fatalf("a copy was added while a push was in flight: %v", err)
	default:
	}
	if err := p.Commit(ctx, nil, ""); err != nil {
		t.Fatalf("a push in flight while a copy is added: %v", err)
	}
	if err := <-added; err != nil {
		t.Fatal(err)
	}
	if err := RecordCopy(ctx, db, "app", primary, 2, "", ""); err != nil {
		t.Fatal(err)
	}
	defer func(w time.Duration) { pushWait = w }(pushWait)
	pushWait = 100 * time.Millisecond
	p, err = BeginPush(ctx, db, "app", primary, timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Rollback()
	if err := DropCopy(ctx, db, "app", "a", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(ctx, nil, ""); err == nil {
		t.Fatal("a push committed across a change of its copies")
	}
}

// TestPushTurnIsALease: a turn held by another node waits for it, until
// it lapses; then the push takes it.
func TestPushTurnIsALease(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	placedAtZero(t, db)
	if _, err := db.Exec("UPDATE cluster_repos SET push_holder = 'x', push_until_ms = " + dbNowMS + " + 60000 WHERE name = 'app'"); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if p, err := BeginPush(short, db, "app", "a", time.Minute); err == nil {
		p.Rollback()
		t.Fatal("a push took a turn another holds")
	}
	if _, err := db.Exec("UPDATE cluster_repos SET push_until_ms = " + dbNowMS + " - 1 WHERE name = 'app'"); err != nil {
		t.Fatal(err)
	}
	p, err := BeginPush(ctx, db, "app", "a", time.Minute)
	if err != nil {
		t.Fatalf("a lapsed turn: %v", err)
	}
	if err := p.Commit(ctx, []string{"b"}, ""); err != nil {
		t.Fatal(err)
	}
	var holder string
	var until int64
	if err := db.QueryRow("SELECT push_holder, push_until_ms FROM cluster_repos WHERE name = 'app'").Scan(&holder, &until); err != nil || holder != "" || until != 0 {
		t.Fatalf("after the commit: holder %q until %d %v, want the turn given back", holder, until, err)
	}
}

// TestPushCommitSettled: a commit whose answer did not come is settled by
// moving the turn on: a commit statement still on its way can then no
// longer land (the push is refused, its copies set back safely), and one
// that landed before is found so (the push stands).
func TestPushCommitSettled(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	placedAtZero(t, db)
	p, err := BeginPush(ctx, db, "app", "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if landed, known := p.settle(); landed || !known {
		t.Fatalf("settled before any commit: landed %v known %v, want not landed, known", landed, known)
	}
	if err := p.Commit(ctx, []string{"b"}, ""); err == nil {
		t.Fatal("a commit landed after its push was settled as not landed")
	}
	p, err = BeginPush(ctx, db, "app", "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(ctx, []string{"b"}, ""); err != nil {
		t.Fatal(err)
	}
	if landed, known := p.settle(); !landed || !known {
		t.Fatalf("settled after the commit landed: landed %v known %v, want landed, known", landed, known)
	}
}
