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

// PushTxn is one push's turn on its repository: claimed in PostgreSQL
// before the push is replicated (BeginPush), and its generation committed
// (Commit) only if the turn and the primacy are still this push's. The
// turn orders pushes to one repository, each replicating from the state
// the previous one committed. Nothing is held in PostgreSQL meanwhile (no
// transaction, no row lock): a primary paused or cut off mid-push holds
// up neither a failover nor anything else, and its push, when it
// resumes, is refused rather than committed.
type PushTxn struct {
	db         *store.DB
	endTurn    func() // lets the repository's next push on this node begin
	repo, node string
	epoch      int64
	turn       int64 // the claim's number (push_turn)
	ended      bool  // Commit or Rollback gave the turn back
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

// PushLease is how long a push's turn lasts: its replication and commit
// (the hook waits ReplicateTimeout and a little more for them). A push
// that outlives it is refused; a turn left by a push that went away
// lapses after it. A failover does not wait for it: the new primary's
// pushes take the turn at once, the old primary's can no longer commit.
const PushLease = ReplicateTimeout + 30*time.Second

// Need is the majority of the replicas, the primary counted.
func (p *PushTxn) Need() int { return p.Total/2 + 1 }

// BeginPush claims repo's push turn for a push on node, its primary: in
// one short transaction it checks that node is still the primary and its
// own copy at the repository's generation (waiting a little for the
// previous push's record of it), takes the turn, and lists the replicas
// to send to.
func BeginPush(ctx context.Context, db *store.DB, repo, node string, timeout time.Duration) (*PushTxn, error) {
	endTurn, err := pushTurns.take(ctx, db, repo, node)
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
		p := &PushTxn{db: db, repo: repo, node: node}
		claimed, mine, holder, err := p.claim(ctx, timeout)
		if err != nil {
			return nil, err
		}
		if claimed {
			return p, nil
		}
		// The push before this one may still be between its commit in
		// PostgreSQL and the record of this copy (or another holds the
		// turn for a moment): wait for it a little, rather than refuse.
		if time.Now().After(deadline) {
			if mine != p.Generation {
				return nil, fmt.Errorf("cluster: this node's copy of %s is behind (generation %d of %d) and is being caught up; nothing was written, push again shortly", repo, mine, p.Generation)
			}
			return nil, fmt.Errorf("cluster: %s's push turn is held by %s; nothing was written, push again shortly", repo, holder)
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

// claim takes the repository's push turn if this node is its primary,
// its copy at the repository's generation, and the turn free (nobody's,
// this node's own, or lapsed), and reads the repository's row and
// replicas (this node's generation, mine, among them): one transaction,
// sent in one round trip, so that a node paused meanwhile holds nothing.
// Bounded by store.RequestTimeout, connecting included.
func (p *PushTxn) claim(ctx context.Context, timeout time.Duration) (claimed bool, mine int64, holder string, err error) {
	ctx, cancel := store.RequestContext(ctx)
	defer cancel()
	conn, err := p.db.Pin(ctx)
	if err != nil {
		return false, 0, "", fmt.Errorf("cluster: the store is unreachable, nothing was written: %w", err)
	}
	defer conn.Close()
	var primary string
	found, own := false, false
	err = conn.Batch(ctx,
		store.Statement{Query: "BEGIN"},
		store.Statement{Query: `UPDATE cluster_repos SET push_turn = push_turn + 1, push_holder = ?, push_until_ms = ` + dbNowMS + ` + ?
			WHERE name = ? AND primary_node = ? AND (push_holder = '' OR push_holder = ? OR push_until_ms < ` + dbNowMS + `)
			AND EXISTS (SELECT 1 FROM replicas rp WHERE rp.repo = cluster_repos.name AND rp.node = ? AND rp.generation = cluster_repos.generation)
			RETURNING push_turn`, Args: []any{p.node, PushLease.Milliseconds(), p.repo, p.node, p.node, p.node},
			Row: func(scan func(...any) error) error {
				claimed = true
				return scan(&p.turn)
			}},
		store.Statement{Query: "SELECT primary_node, generation, " + knownDigest("") + ", epoch, push_holder FROM cluster_repos WHERE name = ?", Args: []any{p.repo},
			Row: func(scan func(...any) error) error {
				found = true
				return scan(&primary, &p.Generation, &p.Digest, &p.epoch, &holder)
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
		store.Statement{Query: "COMMIT"},
	)
	switch {
	case err != nil:
		return false, 0, "", fmt.Errorf("cluster: reading %s's placement: %w", p.repo, err)
	case !found:
		return false, 0, "", fmt.Errorf("cluster: reading %s's placement: %w", p.repo, sql.ErrNoRows)
	case primary != p.node:
		return false, 0, "", fmt.Errorf("cluster: this node is no longer %s's primary (%s is); nothing was written, push again", p.repo, primary)
	case !own:
		return false, 0, "", fmt.Errorf("cluster: this node holds no copy of %s; nothing was written", p.repo)
	}
	return claimed, mine, holder, nil
}

// held is the condition, on a cluster_repos row, that this push still
// holds its turn as the primary of the epoch it claimed it in, its
// lease not lapsed; its arguments are heldArgs.
const held = "name = ? AND primary_node = ? AND epoch = ? AND push_turn = ? AND push_holder = ? AND push_until_ms >= " + dbNowMS

func (p *PushTxn) heldArgs() []any { return []any{p.repo, p.node, p.epoch, p.turn, p.node} }

// Commit records the push, if its turn is still held: the repository's
// next generation with the digest of its refs, and the voters' (the
// other replicas that hold it: the caller counts only those whose refs,
// read after they took the push, have that digest), and gives the turn
// back, in one statement. The primary's own copy is recorded once git
// has written its refs and they have the digest too (RecordCopy). A push
// whose node lost the primacy or the turn meanwhile (a failover, a copy
// moved, the lease lapsed) records nothing and is refused.
func (p *PushTxn) Commit(ctx context.Context, voters []string, digest string) error {
	if p.ended {
		return errors.New("cluster: the push's turn has ended")
	}
	defer p.Rollback()
	args := append([]any{digest}, p.heldArgs()...)
	args = append(args, p.Generation+1, p.repo)
	marks := make([]string, len(voters))
	for i, v := range voters {
		marks[i] = "?"
		args = append(args, v)
	}
	voted := "SELECT 1"
	if len(voters) > 0 {
		voted = "UPDATE replicas SET generation = ? WHERE repo = ? AND node IN (" + strings.Join(marks, ", ") + ") AND EXISTS (SELECT 1 FROM bumped) RETURNING 1"
	} else {
		args = args[:1+len(p.heldArgs())]
	}
	bumped := -1
	commit := store.Statement{Query: `WITH bumped AS (
		UPDATE cluster_repos SET generation = generation + 1, digest = NULLIF(?, ''), digest_generation = generation + 1, committed_ms = ` + dbNowMS + `, push_holder = '', push_until_ms = 0 WHERE ` + held + ` RETURNING 1
	), voted AS (` + voted + `)
	SELECT (SELECT count(*) FROM bumped)`, Args: args, Row: func(scan func(...any) error) error { return scan(&bumped) }}
	ctx, cancel := store.RequestContext(ctx)
	defer cancel()
	conn, err := p.db.Pin(ctx)
	if err != nil {
		return fmt.Errorf("cluster: committing the push: %w", err)
	}
	err = conn.Batch(ctx, commit)
	conn.Close()
	if err != nil {
		// Sent, perhaps, its answer lost: the statement may have landed,
		// or still land (a connection cut with it unread).
		switch landed, known := p.settle(); {
		case landed:
			p.ended = true
			return nil
		case known:
			return fmt.Errorf("cluster: committing the push: %w", err)
		default:
			return fmt.Errorf("%w: %v", ErrCommitUnknown, err)
		}
	}
	if bumped != 1 {
		return fmt.Errorf("cluster: %s's primary changed, or its push turn was taken, during the push; nothing was written, push again", p.repo)
	}
	p.ended = true // given back with the commit
	return nil
}

// ErrCommitUnknown: the store did not answer a push's commit, nor could
// it be asked afterwards whether the commit landed. The push is refused
// (it may have been recorded), and the copies that took it are left as
// they are: set back, they would lack a generation they may be recorded
// at; left, a copy that is ahead refuses the next push and is caught up.
var ErrCommitUnknown = errors.New("cluster: the store did not answer the push's commit")

// settle makes the outcome of a commit whose answer did not come certain:
// it moves the turn on, so that the commit statement, if still on its
// way, can no longer land, and reads whether it landed before. known is
// false when that cannot be told (the store unreachable still, or the
// turn taken meanwhile by a failover or a move with the generation
// moved).
func (p *PushTxn) settle() (landed, known bool) {
	ctx, cancel := store.RequestContext(context.Background())
	defer cancel()
	var gen, epoch int64
	err := p.db.QueryRowContext(ctx, "UPDATE cluster_repos SET push_turn = push_turn + 1, push_holder = '', push_until_ms = 0 WHERE name = ? AND push_turn = ? RETURNING generation, epoch",
		p.repo, p.turn).Scan(&gen, &epoch)
	switch {
	case err == nil:
		// The turn was still this push's: only its commit moved the
		// generation.
		return gen == p.Generation+1 && epoch == p.epoch, true
	case errors.Is(err, sql.ErrNoRows):
		// Taken away (its commit can no longer land); landed before only
		// if the generation moved, which another primary may have done.
		err = p.db.QueryRowContext(ctx, "SELECT generation FROM cluster_repos WHERE name = ?", p.repo).Scan(&gen)
		return false, err == nil && gen == p.Generation
	}
	return false, false
}

// MarkStale records nodes' copies, found not at the primary's state
// (they refused the push's old values), as behind the repository's
// generation, if this push still holds its turn: their nodes catch them
// up from the primary, which repairs them.
func (p *PushTxn) MarkStale(ctx context.Context, nodes []string) error {
	if p.ended {
		return errors.New("cluster: the push's turn has ended")
	}
	marks := make([]string, len(nodes))
	args := []any{p.Generation - 1, p.repo, p.Generation}
	for i, n := range nodes {
		marks[i] = "?"
		args = append(args, n)
	}
	_, err := p.db.ExecContext(ctx, "UPDATE replicas SET generation = ? WHERE repo = ? AND generation = ? AND node IN ("+strings.Join(marks, ", ")+
		") AND EXISTS (SELECT 1 FROM cluster_repos WHERE "+held+")", append(args, p.heldArgs()...)...)
	return err
}

// Rollback gives the turn back, if still held: nothing is recorded. A
// turn it could not give back (the store unreachable) lapses by itself,
// and this node's next push may take it at once.
func (p *PushTxn) Rollback() {
	if !p.ended {
		p.ended = true
		ctx, cancel := store.RequestContext(context.Background())
		p.db.ExecContext(ctx, "UPDATE cluster_repos SET push_holder = '', push_until_ms = 0 WHERE name = ? AND push_turn = ? AND push_holder = ?", p.repo, p.turn, p.node)
		cancel()
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
	db         *store.DB
	repo, node string
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
func (ts *turns) take(ctx context.Context, db *store.DB, repo, node string) (func(), error) {
	key := turnKey{db, repo, node}
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
