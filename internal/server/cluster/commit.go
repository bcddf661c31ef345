package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"packwire/internal/store"
)

// PushTxn is one push's transaction on its repository's row, held from
// before the push is replicated until its generation is committed: the
// row lock orders pushes to one repository, each replicating from the
// state the previous one committed.
type PushTxn struct {
	conn       *store.Conn // in the transaction, until Commit, Close or Rollback
	endTurn    func()      // lets the repository's next push on this node begin
	repo, node string
	epoch      int64
	marked     bool // MarkStale wrote in the transaction
	// Generation is the repository's generation before this push, and
	// Digest its refs' digest ("": not known, see Placement.Digest).
	Generation int64
	Digest     string
	// Total counts the repository's replicas, the primary's included.
	Total int
	// Targets are the other replicas that can take the push: healthy and
	// at Generation. Skipped are the others, with why.
	Targets []Replica
	Skipped []string
}

// Need is the majority of the replicas, the primary counted.
func (p *PushTxn) Need() int { return p.Total/2 + 1 }

// BeginPush opens the transaction of a push on node, repo's primary: it
// locks the repository's row, checks that node is still the primary and
// its own copy at the repository's generation (waiting a little for the
// previous push's record of it, without holding the lock meanwhile), and
// lists the replicas to send to.
func BeginPush(ctx context.Context, db *store.DB, repo, node string, timeout time.Duration) (*PushTxn, error) {
	endTurn, err := pushTurns.take(ctx, db, repo)
	if err != nil {
		return nil, err
	}
	p, err := beginPush(ctx, db, repo, node, timeout)
	if err != nil {
		endTurn()
		return nil, err
	}
	p.endTurn = sync.OnceFunc(endTurn)
	return p, nil
}

func beginPush(ctx context.Context, db *store.DB, repo, node string, timeout time.Duration) (*PushTxn, error) {
	deadline := time.Now().Add(ownRecordWait)
	for {
		// A connection of its own, the transaction driven by hand so that
		// BEGIN, the lock and the read go in one round trip (the push
		// waits for each). The wait for the connection ends with ctx (the
		// pool is bounded); the transaction does not: a push given up on
		// still records what MarkStale found, with a bounded context of
		// its own; each batch has ctx.
		conn, err := db.Pin(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("cluster: no connection to the store in time, nothing was written: %w", err)
			}
			return nil, fmt.Errorf("cluster: the store is unreachable, nothing was written: %w", err)
		}
		p := &PushTxn{conn: conn, repo: repo, node: node}
		mine, err := p.begin(ctx, timeout)
		if err == nil && mine == p.Generation {
			return p, nil
		}
		p.Rollback()
		if err != nil {
			return nil, err
		}
		// The push before this one may still be between its commit in
		// PostgreSQL and the record of this copy: wait for it a little,
		// rather than refuse, with the row unlocked (a failover or a
		// deletion may need it meanwhile).
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("cluster: this node's copy of %s is behind (generation %d of %d) and is being caught up; nothing was written, push again shortly", repo, mine, p.Generation)
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// ownRecordWait bounds BeginPush's wait for the record of the primary's
// own copy after the previous push.
const ownRecordWait = 5 * time.Second

// begin opens the transaction, locks the repository's row and reads its
// replicas (this node's generation, mine, among them): three statements in
// one round trip, run in order, each with a snapshot of its own, so the
// replicas are read once the lock is granted, as the previous push
// committed them.
func (p *PushTxn) begin(ctx context.Context, timeout time.Duration) (mine int64, err error) {
	var primary string
	locked, own := false, false
	err = p.conn.Batch(ctx,
		store.Statement{Query: "BEGIN"},
		store.Statement{Query: "SELECT primary_node, generation, " + knownDigest("") + ", epoch FROM cluster_repos WHERE name = ? FOR UPDATE", Args: []any{p.repo},
			Row: func(scan func(...any) error) error {
				locked = true
				return scan(&primary, &p.Generation, &p.Digest, &p.epoch)
			}},
		store.Statement{Query: `SELECT rp.node, nd.url, rp.generation, ` + healthySQL + ` FROM replicas rp
		JOIN nodes nd ON nd.name = rp.node WHERE rp.repo = ? ORDER BY rp.node`, Args: []any{timeout.Milliseconds(), p.repo},
			Row: func(scan func(...any) error) error {
				var r Replica
				if err := scan(&r.Node, &r.URL, &r.Generation, &r.Healthy); err != nil {
					return err
				}
				p.Total++
				switch {
				case r.Node == p.node:
					mine, own = r.Generation, true
				case !r.Healthy || r.Generation != p.Generation:
					p.Skipped = append(p.Skipped, r.Node+": not up to date or unhealthy")
				default:
					p.Targets = append(p.Targets, r)
				}
				return nil
			}},
	)
	switch {
	case err != nil:
		return 0, fmt.Errorf("cluster: reading %s's placement: %w", p.repo, err)
	case !locked:
		return 0, fmt.Errorf("cluster: reading %s's placement: %w", p.repo, sql.ErrNoRows)
	case primary != p.node:
		return 0, fmt.Errorf("cluster: this node is no longer %s's primary (%s is); nothing was written, push again", p.repo, primary)
	case !own:
		return 0, fmt.Errorf("cluster: this node holds no copy of %s; nothing was written", p.repo)
	}
	return mine, nil
}

// Commit records the push: the repository's next generation with the
// digest of its refs, and the voters' (the other replicas that hold it:
// the caller counts only those whose refs, read after they took the
// push, have that digest). The primary's own copy is recorded once git
// has written its refs and they have the digest too (RecordCopy).
func (p *PushTxn) Commit(ctx context.Context, voters []string, digest string) error {
	defer p.Rollback()
	// One statement: the voters are recorded only if the repository's row
	// moved, which it does only while this node is the primary of this
	// epoch.
	args := []any{digest, p.repo, p.node, p.epoch, p.Generation + 1, p.repo}
	marks := make([]string, len(voters))
	for i, v := range voters {
		marks[i] = "?"
		args = append(args, v)
	}
	voted := "SELECT 1"
	if len(voters) > 0 {
		voted = "UPDATE replicas SET generation = ? WHERE repo = ? AND node IN (" + strings.Join(marks, ", ") + ") AND EXISTS (SELECT 1 FROM bumped) RETURNING 1"
	} else {
		args = args[:4]
	}
	bumped := -1
	commit := store.Statement{Query: `WITH bumped AS (
		UPDATE cluster_repos SET generation = generation + 1, digest = NULLIF(?, ''), digest_generation = generation + 1, committed_ms = ` + dbNowMS + ` WHERE name = ? AND primary_node = ? AND epoch = ? RETURNING 1
	), voted AS (` + voted + `)
	SELECT (SELECT count(*) FROM bumped)`, Args: args, Row: func(scan func(...any) error) error { return scan(&bumped) }}
	stmts := []store.Statement{commit}
	if !p.marked {
		// With COMMIT, in the same round trip: the statement is the
		// transaction's only write, and writes nothing unless the row
		// moved. After MarkStale, COMMIT waits for the check below, so
		// that nothing is recorded for a primary that changed.
		stmts = append(stmts, store.Statement{Query: "COMMIT"})
	}
	if err := p.conn.Batch(ctx, stmts...); err != nil {
		return fmt.Errorf("cluster: committing the push: %w", err)
	}
	if !p.marked {
		p.release() // COMMIT ran
	}
	if bumped != 1 {
		return fmt.Errorf("cluster: %s's primary changed during the push; nothing was written, push again", p.repo)
	}
	if p.marked {
		if err := p.conn.Batch(ctx, store.Statement{Query: "COMMIT"}); err != nil {
			return fmt.Errorf("cluster: committing the push: %w", err)
		}
	}
	p.release()
	return nil
}

// MarkStale records nodes' copies, found not at the primary's state
// (they refused the push's old values), as behind the repository's
// generation: their nodes catch them up from the primary, which repairs
// them. Part of the transaction: Commit or Close records it.
func (p *PushTxn) MarkStale(ctx context.Context, nodes []string) error {
	if p.conn == nil {
		return errors.New("cluster: the push's transaction has ended")
	}
	p.marked = true
	stmts := make([]store.Statement, len(nodes))
	for i, n := range nodes {
		stmts[i] = store.Statement{Query: "UPDATE replicas SET generation = ? WHERE repo = ? AND node = ? AND generation = ?", Args: []any{p.Generation - 1, p.repo, n, p.Generation}}
	}
	return p.conn.Batch(ctx, stmts...)
}

// Close ends a push that failed, recording only what MarkStale marked.
func (p *PushTxn) Close() error {
	if p.conn == nil {
		return errors.New("cluster: the push's transaction has ended")
	}
	defer p.Rollback()
	if err := p.conn.Batch(context.Background(), store.Statement{Query: "COMMIT"}); err != nil {
		return err
	}
	p.release()
	return nil
}

// Rollback gives the transaction up, if still open: nothing is recorded.
func (p *PushTxn) Rollback() {
	if p.conn == nil {
		return
	}
	// A connection whose ROLLBACK failed is left in its transaction: the
	// pool discards it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p.conn.Batch(ctx, store.Statement{Query: "ROLLBACK"})
	p.release()
}

// release gives the connection back, its transaction ended, and lets the
// repository's next push take its turn.
func (p *PushTxn) release() {
	if p.conn != nil {
		p.conn.Close()
		p.conn = nil
	}
	if p.endTurn != nil {
		p.endTurn()
	}
}

// pushTurns are the turns of a process's pushes, by store and repository.
// The node's pushes to one repository take turns in the process before
// they take a connection: the row lock orders them anyway, and each one
// waiting for it in PostgreSQL would hold a connection of the store's
// bounded pool meanwhile, so that a storm of pushes to one repository
// would starve every other request of the node.
var pushTurns = &turns{}

type turnKey struct {
	db   *store.DB
	repo string
}

// turns is a queue per key: one holder at a time, the others waiting in
// the order they came (a channel's senders), each within its context.
type turns struct {
	mu sync.Mutex
	m  map[turnKey]*turn
}

type turn struct {
	ch    chan struct{} // holds a value while taken
	users int           // holders and waiters: the entry goes with the last
}

// take waits for key's turn; the function returned ends it.
func (ts *turns) take(ctx context.Context, db *store.DB, repo string) (func(), error) {
	key := turnKey{db, repo}
	ts.mu.Lock()
	if ts.m == nil {
		ts.m = map[turnKey]*turn{}
	}
	t := ts.m[key]
	if t == nil {
		t = &turn{ch: make(chan struct{}, 1)}
		ts.m[key] = t
	}
	t.users++
	ts.mu.Unlock()
	leave := func() {
		ts.mu.Lock()
		if t.users--; t.users == 0 {
			delete(ts.m, key)
		}
		ts.mu.Unlock()
	}
	select {
	case t.ch <- struct{}{}:
		return func() { <-t.ch; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, fmt.Errorf("cluster: waiting for the pushes to %s before this one: %w", repo, ctx.Err())
	}
}

// RecordCopy records that node's copy of repo holds generation gen, if it
// was at the one before (a primary after git committed its refs; a
// replica that took a push after the push was answered) and got, the
// digest of its refs read after its writes, is want, gen's ("": not
// known); ErrNotTheRefs otherwise, and the copy stays behind, to be
// caught up. A copy that moved meanwhile is left as it is: stale ones
// are caught up.
func RecordCopy(ctx context.Context, db *store.DB, repo, node string, gen int64, want, got string) error {
	if want != "" && got != want {
		return fmt.Errorf("%s's copy of %s at generation %d: %w", node, repo, gen, ErrNotTheRefs)
	}
	_, err := db.ExecContext(ctx, "UPDATE replicas SET generation = ? WHERE repo = ? AND node = ? AND generation = ?", gen, repo, node, gen-1)
	return err
}
