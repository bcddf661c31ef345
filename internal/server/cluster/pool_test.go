package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"packwire/internal/pgtest"
	"packwire/internal/store"
)

// openStoreURL is openStore, with the database's URL.
func openStoreURL(t *testing.T) (*store.Store, string) {
	t.Helper()
	url := pgtest.Shared(t).NewDatabase(t)
	st, err := store.OpenPostgres(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, url
}

// placeOn places repo on nodes with every copy at generation 0 (created).
func placeOn(t *testing.T, db *store.DB, repo string, n int, timeout time.Duration) Placement {
	t.Helper()
	ctx := context.Background()
	p, err := Place(ctx, db, repo, "", n, timeout)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range p.Replicas {
		if ok, err := SetReplicaGeneration(ctx, db, repo, r.Node, 0, EmptyDigest); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	return p
}

// heartbeatMS reads node's last heartbeat.
func heartbeatMS(t *testing.T, db *store.DB, node string) int64 {
	t.Helper()
	var ms int64
	if err := db.QueryRow("SELECT heartbeat_ms FROM nodes WHERE name = ?", node).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	return ms
}

// TestHeartbeatWithTheStorePoolFull: a node whose store pool is full of
// pushes waiting for a repository's row lock keeps heartbeating on its
// own connection (Membership), and no other node fails it over.
func TestHeartbeatWithTheStorePoolFull(t *testing.T) {
	ctx := context.Background()
	st, url := openStoreURL(t)
	admin := st.DB
	pool, err := store.OpenPostgresPool(url, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	membership, err := store.OpenPostgresPool(url, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer membership.Close()
	const timeout = 500 * time.Millisecond
	nodes := join(t, admin, "a", "b")
	placeOn(t, admin, "app", 2, timeout)
	a := nodes[0]
	a.DB, a.Membership, a.Heartbeat, a.Timeout = pool, membership, 50*time.Millisecond, timeout
	// Both of a's connections are taken: one holds app's row, the other
	// waits for it.
	holder, err := lockRepo(ctx, pool, "app")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback() // on failure too: the pool closes only once it is given back
	waiting := make(chan error, 1)
	go func() {
		tx, err := pool.BeginTx(ctx, nil)
		if err == nil {
			var name string
			err = tx.QueryRowContext(ctx, "SELECT name FROM cluster_repos WHERE name = 'app' FOR UPDATE").Scan(&name)
			tx.Rollback()
		}
		waiting <- err
	}()
	for pool.Stats().InUse < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := pool.ExecContext(short, "SELECT 1"); err == nil {
		t.Fatal("the store pool is not full")
	}
	cancel()

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(runCtx) }()
	defer func() { stop(); <-done }()
	b := nodes[1]
	before := heartbeatMS(t, admin, "a")
	for end := time.Now().Add(4 * timeout); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		b.beat(ctx, ctx)
		if got, err := Failover(ctx, admin, timeout); err != nil || len(got) != 0 {
			t.Fatalf("failover while a is alive: %+v %v", got, err)
		}
	}
	if after := heartbeatMS(t, admin, "a"); after-before < int64(2*timeout/time.Millisecond) {
		t.Fatalf("a's heartbeat moved %d ms in %s with its store pool full", after-before, 4*timeout)
	}
	holder.Rollback()
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}
}

// TestFailoverSkipsALockedRepository: the monitor does not wait for a
// repository whose row a transaction holds (it would hold the heartbeat
// up, on the same connection); it promotes once the row is free.
func TestFailoverSkipsALockedRepository(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = 300 * time.Millisecond
	nodes := join(t, db, "a", "b")
	placeOn(t, db, "app", 2, timeout)
	holder, err := lockRepo(ctx, db, "app")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	time.Sleep(timeout + 100*time.Millisecond)
	nodes[1].beat(ctx, ctx) // a is silent, b healthy
	check, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	began := time.Now()
	got, err := Failover(check, db, timeout)
	if err != nil || len(got) != 0 || time.Since(began) > time.Second {
		t.Fatalf("failover with app's row locked: %+v %v after %s, want nothing at once", got, err, time.Since(began))
	}
	holder.Rollback()
	got, err = Failover(ctx, db, timeout)
	if err != nil || len(got) != 1 || got[0].To != "b" {
		t.Fatalf("failover once the row is free: %+v %v", got, err)
	}
}

// TestSlowTickDoesNotHoldHeartbeatsUp: the node's catch-up (OnTick) may
// take long (a fetch, a wait for the store pool); heartbeats go on.
func TestSlowTickDoesNotHoldHeartbeatsUp(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = 400 * time.Millisecond
	a := join(t, db, "a")[0]
	a.Heartbeat, a.Timeout = 50*time.Millisecond, timeout
	var mu sync.Mutex
	ticks := 0
	release := make(chan struct{})
	a.OnTick = func(ctx context.Context) {
		mu.Lock()
		ticks++
		mu.Unlock()
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(runCtx) }()
	time.Sleep(100 * time.Millisecond)
	before := heartbeatMS(t, db, "a")
	time.Sleep(3 * timeout)
	after := heartbeatMS(t, db, "a")
	mu.Lock()
	ran := ticks
	mu.Unlock()
	close(release)
	stop()
	<-done
	if after-before < int64(2*timeout/time.Millisecond) {
		t.Fatalf("a's heartbeat moved %d ms in %s while a tick ran", after-before, 3*timeout)
	}
	if ran != 1 {
		t.Fatalf("%d ticks ran, want 1 (the first, still running)", ran)
	}
}

// TestPushesToOneRepositoryTakeTurnsWithoutConnections: pushes waiting
// for the one before them to the same repository hold no connection of
// the store's pool: the node's other queries still get one.
func TestPushesToOneRepositoryTakeTurnsWithoutConnections(t *testing.T) {
	ctx := context.Background()
	st, url := openStoreURL(t)
	pool, err := store.OpenPostgresPool(url, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const timeout = 2 * time.Second
	join(t, st.DB, "a")
	placeOn(t, st.DB, "app", 1, timeout)
	first, err := BeginPush(ctx, pool, "app", "a", timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback() // on failure: the waiting pushes go on, the pool can close
	var wg sync.WaitGroup
	order := make(chan int, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := BeginPush(ctx, pool, "app", "a", timeout)
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			if err := p.Commit(ctx, nil, ""); err != nil {
				t.Error(err)
			}
			// The next push waits for this copy's record (a primary's
			// own, once git wrote its refs).
			if err := RecordCopy(ctx, pool, "app", "a", p.Generation+1, "", ""); err != nil {
				t.Error(err)
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the four are waiting
	for range 3 {
		short, cancel := context.WithTimeout(ctx, time.Second)
		var one int
		err := pool.QueryRowContext(short, "SELECT 1").Scan(&one)
		cancel()
		if err != nil {
			t.Fatalf("a query of the node while pushes wait their turn: %v (pool %+v)", err, pool.Stats())
		}
	}
	if err := first.Commit(ctx, nil, ""); err != nil {
		t.Fatal(err)
	}
	if err := RecordCopy(ctx, pool, "app", "a", 1, "", ""); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(order)
	if n := len(order); n != 4 {
		t.Fatalf("%d of 4 waiting pushes went through", n)
	}
	var gen int64
	if err := pool.QueryRow("SELECT generation FROM cluster_repos WHERE name = 'app'").Scan(&gen); err != nil || gen != 5 {
		t.Fatalf("generation %d %v, want 5", gen, err)
	}
	if n := len(pushTurns.m); n != 0 {
		t.Fatalf("%d turn entries left", n)
	}
	// A push given up on while waiting leaves its turn.
	held, err := BeginPush(ctx, pool, "app", "a", timeout)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := BeginPush(short, pool, "app", "a", timeout); err == nil {
		t.Fatal("a push began while another held the repository")
	}
	cancel()
	held.Rollback()
	if n := len(pushTurns.m); n != 0 {
		t.Fatalf("%d turn entries left after a push given up on", n)
	}
}
