package cluster

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/pgtest"
	"packwire/internal/store"
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.OpenPostgres(context.Background(), pgtest.Shared(t).NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func join(t *testing.T, db *store.DB, names ...string) []*Node {
	t.Helper()
	var nodes []*Node
	for _, name := range names {
		n := &Node{DB: db, Name: name, URL: "http://" + name, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		if err := n.Join(context.Background()); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// TestPlacementAndFailover: a repository is placed on three healthy nodes;
// when its primary stops heartbeating, monitors racing on three nodes
// promote exactly one up-to-date replica, never a stale one, and never a
// replica of an unhealthy node.
func TestPlacementAndFailover(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	db := st.DB
	// A node is healthy for 2 s after its beat: 400 ms was missed at a
	// load average of 50 on 2 cores (b, c and d read as down).
	const timeout = 2 * time.Second
	nodes := join(t, db, "a", "b", "c", "d")
	p, err := Place(ctx, db, "team/app", "", 3, timeout)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Replicas) != 3 || p.Primary != "a" {
		t.Fatalf("placement %+v: want 3 replicas, primary a (least loaded, then by name)", p)
	}
	if _, err := Place(ctx, db, "team/app", "", 3, timeout); !errors.Is(err, store.ErrExists) {
		t.Fatalf("placing it twice: %v", err)
	}
	// The next repository goes to the least-loaded nodes: d first.
	p2, err := Place(ctx, db, "team/lib", "", 1, timeout)
	if err != nil || p2.Primary != "d" {
		t.Fatalf("second placement %+v %v: want d", p2, err)
	}
	for _, r := range p.Replicas {
		if ok, err := SetReplicaGeneration(ctx, db, "team/app", r.Node, 0, EmptyDigest); !ok || err != nil {
			t.Fatalf("replica %s at 0: %v %v", r.Node, ok, err)
		}
	}
	// A push committed generation 1 on a and b; c missed it.
	if _, err := db.Exec("UPDATE cluster_repos SET generation = 1 WHERE name = 'team/app'"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE replicas SET generation = 1 WHERE repo = 'team/app' AND node IN ('a', 'b')"); err != nil {
		t.Fatal(err)
	}
	// A stale copy cannot be recorded as current.
	if ok, _ := SetReplicaGeneration(ctx, db, "team/app", "c", 0, EmptyDigest); ok {
		t.Fatal("a replica recorded at a generation the repository has left")
	}
	// Nothing happens while a heartbeats.
	if got, err := Failover(ctx, db, timeout); err != nil || len(got) != 0 {
		t.Fatalf("failover with every node healthy: %v %v", got, err)
	}
	// a stops; b, c, d keep beating (once more just before each check, so
	// that a slow machine does not make them look down too).
	beatOthers := func() {
		t.Helper()
		for _, n := range nodes[1:] {
			if err := n.beat(ctx, ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for deadline := time.Now().Add(timeout + 100*time.Millisecond); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		beatOthers()
	}
	beatOthers()
	var mu sync.Mutex
	var all []Promotion
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := Failover(ctx, db, timeout)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			all = append(all, got...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(all) != 1 || all[0].To != "b" || all[0].From != "a" {
		t.Fatalf("promotions %+v: want exactly one, a -> b (c is stale)", all)
	}
	beatOthers()
	s, err := ReadStatus(ctx, db, timeout)
	if err != nil {
		t.Fatal(err)
	}
	var healthy []string
	for _, n := range s.Nodes {
		if n.Healthy {
			healthy = append(healthy, n.Name)
		}
	}
	if len(s.Nodes) != 4 || len(healthy) != 3 || healthy[0] != "b" {
		t.Fatalf("status nodes %+v", s.Nodes)
	}
	if len(s.Repos) != 2 || s.Repos[0].Name != "team/app" || s.Repos[0].Primary != "b" || s.Repos[0].Epoch != 1 {
		t.Fatalf("status repos %+v", s.Repos)
	}
	// team/lib's only replica was d, healthy: untouched.
	if s.Repos[1].Primary != "d" {
		t.Fatalf("team/lib moved: %+v", s.Repos[1])
	}
}

// TestFailoverKeepsPrimaryWithoutUpToDateReplica: if no healthy replica is
// at the repository's generation, the primary stays (its writes wait for
// it) rather than promote a copy that lacks acknowledged pushes.
func TestFailoverKeepsPrimaryWithoutUpToDateReplica(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = 300 * time.Millisecond
	nodes := join(t, db, "a", "b")
	if _, err := Place(ctx, db, "r", "", 2, timeout); err != nil {
		t.Fatal(err)
	}
	db.Exec("UPDATE cluster_repos SET generation = 3 WHERE name = 'r'")
	db.Exec("UPDATE replicas SET generation = 3 WHERE node = 'a'")
	db.Exec("UPDATE replicas SET generation = 2 WHERE node = 'b'")
	time.Sleep(timeout + 100*time.Millisecond)
	nodes[1].beat(ctx, ctx)
	got, err := Failover(ctx, db, timeout)
	if err != nil || len(got) != 0 {
		t.Fatalf("promoted a stale replica: %+v %v", got, err)
	}
}

func TestNotClusteredOnSQLite(t *testing.T) {
	st, err := store.Open(context.Background(), t.TempDir()+"/p.db")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	n := &Node{DB: st.DB, Name: "a"}
	if err := n.Join(context.Background()); !errors.Is(err, ErrNotClustered) {
		t.Fatalf("join on SQLite: %v", err)
	}
}

// TestNoFailoverRightAfterReconnecting: when PostgreSQL was away longer
// than the node timeout, every heartbeat is stale; the first node back
// must not promote replicas away from a primary that is alive and
// heartbeats again moments later. A primary that stays silent is still
// replaced.
func TestNoFailoverRightAfterReconnecting(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	db := st.DB
	const timeout = 2 * time.Second
	nodes := join(t, db, "a", "b")
	if _, err := Place(ctx, db, "app", "", 2, timeout); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		if ok, err := SetReplicaGeneration(ctx, db, "app", n, 0, EmptyDigest); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	primary := func() string {
		pl, err := Locate(ctx, db, "app", timeout)
		if err != nil {
			t.Fatal(err)
		}
		return pl.Primary
	}
	if primary() != "a" {
		t.Fatalf("primary %s, want a", primary())
	}
	// PostgreSQL was away for a minute: both heartbeats are that old.
	if _, err := db.Exec("UPDATE nodes SET heartbeat_ms = heartbeat_ms - 60000"); err != nil {
		t.Fatal(err)
	}
	beatA := func() {
		if _, err := db.Exec("UPDATE nodes SET heartbeat_ms = " + dbNowMS + " WHERE name = 'a'"); err != nil {
			t.Error(err)
		}
	}
	// b comes back first and runs its monitor; a heartbeats again a moment
	// later (its own loop, played here).
	b := nodes[1]
	b.Heartbeat, b.Timeout = 50*time.Millisecond, timeout
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); b.Run(runCtx) }()
	defer func() { stop(); <-done }()
	// a is back only once b has run a monitor tick (its heartbeat is
	// fresh, and its check follows the heartbeat in the same tick).
	for fresh := false; !fresh; time.Sleep(10 * time.Millisecond) {
		if err := db.QueryRow("SELECT " + dbNowMS + " - heartbeat_ms < 1000 FROM nodes WHERE name = 'b'").Scan(&fresh); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	for end := time.Now().Add(timeout + time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		beatA()
		if p := primary(); p != "a" {
			t.Fatalf("b promoted itself (%s) over a primary that heartbeats again", p)
		}
	}
	// a stays silent now: b takes over once a is a timeout old.
	deadline := time.Now().Add(3 * timeout)
	for primary() != "b" {
		if time.Now().After(deadline) {
			t.Fatal("a silent primary was not replaced")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPlaceSpreadsPrimaries: with every repository on every node (three
// nodes, three copies) the primaries go to the node with the fewest
// first, so three new repositories get three different primaries, and a
// fourth the first node again (before: every one on node a).
func TestPlaceSpreadsPrimaries(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = 10 * time.Second
	join(t, db, "a", "b", "c")
	var got []string
	for _, name := range []string{"r1", "r2", "r3", "r4"} {
		p, err := Place(ctx, db, name, "", 3, timeout)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Replicas) != 3 {
			t.Fatalf("%s placed on %+v, want three nodes", name, p.Replicas)
		}
		got = append(got, p.Primary)
	}
	if want := "a b c a"; strings.Join(got, " ") != want {
		t.Fatalf("primaries %v, want %s", got, want)
	}
}

// TestFailoverMovesAPrimaryCutOffFromItsCopies: every node heartbeats,
// but the primary reports that it has not reached the other two copies'
// nodes (a partition between it and its replicas, PostgreSQL reached by
// all): the monitor moves the primary to an up-to-date replica whose node
// reaches a majority of the copies, never to one cut off itself, and
// leaves alone a primary that reaches a majority (one replica away).
func TestFailoverMovesAPrimaryCutOffFromItsCopies(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = 30 * time.Second // every node stays healthy throughout
	join(t, db, "a", "b", "c", "d")
	p, err := Place(ctx, db, "team/app", "", 3, timeout)
	if err != nil || p.Primary != "a" {
		t.Fatalf("placement %+v %v: want primary a", p, err)
	}
	for _, r := range p.Replicas {
		if ok, err := SetReplicaGeneration(ctx, db, "team/app", r.Node, 0, EmptyDigest); !ok || err != nil {
			t.Fatalf("replica %s at 0: %v %v", r.Node, ok, err)
		}
	}
	unreached := func(node, list string) {
		t.Helper()
		if _, err := db.Exec("UPDATE nodes SET unreached = ? WHERE name = ?", list, node); err != nil {
			t.Fatal(err)
		}
	}
	// a misses one copy (and d, which holds none): a, and one more, are a
	// majority; nothing moves.
	unreached("a", ",b,d,")
	if got, err := Failover(ctx, db, timeout); err != nil || len(got) != 0 {
		t.Fatalf("failover of a primary reaching a majority: %v %v", got, err)
	}
	// a reaches neither b nor c; b is cut off from c too, c reaches b:
	// only c, with b, is a majority.
	unreached("a", ",b,c,")
	unreached("b", ",a,c,")
	unreached("c", ",a,")
	got, err := Failover(ctx, db, timeout)
	if err != nil || len(got) != 1 || got[0].From != "a" || got[0].To != "c" || !got[0].Cut {
		t.Fatalf("failover of a primary cut off: %+v %v; want a to c", got, err)
	}
	// c, now primary, reaches a majority: it stays.
	if got, err := Failover(ctx, db, timeout); err != nil || len(got) != 0 {
		t.Fatalf("second failover check: %+v %v", got, err)
	}
	// Every node cut off from every other: nobody can make a majority,
	// and the primary stays where it is.
	unreached("c", ",a,b,")
	if got, err := Failover(ctx, db, timeout); err != nil || len(got) != 0 {
		t.Fatalf("failover with no side holding a majority: %+v %v", got, err)
	}
}

// TestFailoverOfACopyBehindNeedsACandidateReachingAMajority: a primary
// alive whose own copy stayed behind is failed over only to a copy whose
// node reaches a majority of the copies; one partitioned from the others
// could take no push (issue 29: the repository waited on it for good).
func TestFailoverOfACopyBehindNeedsACandidateReachingAMajority(t *testing.T) {
	ctx := context.Background()
	db := openStore(t).DB
	const timeout = 30 * time.Second // every node stays healthy throughout
	join(t, db, "a", "b", "c")
	p, err := Place(ctx, db, "team/app", "", 3, timeout)
	if err != nil || p.Primary != "a" {
		t.Fatalf("placement %+v %v: want primary a", p, err)
	}
	// Generation 3, committed long ago; a's own copy stayed at 2.
	for _, q := range []string{
		"UPDATE cluster_repos SET generation = 3, committed_ms = 0 WHERE name = 'team/app'",
		"UPDATE replicas SET generation = 3 WHERE repo = 'team/app' AND node IN ('b', 'c')",
		"UPDATE replicas SET generation = 2 WHERE repo = 'team/app' AND node = 'a'",
		// b is partitioned from a and c, and the only copy at the
		// generation (c is behind too, as in the issue).
		"UPDATE nodes SET unreached = ',a,c,' WHERE name = 'b'",
		"UPDATE replicas SET generation = 2 WHERE repo = 'team/app' AND node = 'c'",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := Failover(ctx, db, timeout); err != nil || len(got) != 0 {
		t.Fatalf("failed over to a node cut off from the copies: %+v %v", got, err)
	}
	// b reaches c again: it is promoted.
	if _, err := db.Exec("UPDATE nodes SET unreached = ',a,' WHERE name = 'b'"); err != nil {
		t.Fatal(err)
	}
	got, err := Failover(ctx, db, timeout)
	if err != nil || len(got) != 1 || got[0].From != "a" || got[0].To != "b" || got[0].Cut {
		t.Fatalf("failover of a copy behind: %+v %v; want a to b", got, err)
	}
}
