package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"packwire/internal/store"
)

// MaxHold bounds how long a catch-up holds a repository's pushes
// (HoldPushes), from the moment it has the repository's turn.
const MaxHold = 5 * time.Second

// holdLockWait bounds HoldPushes' wait for a push in flight to end.
const holdLockWait = 10 * time.Second

// HoldPushes takes the repository's turn of pushes (the push turn a
// push's BeginPush claims, here held by "NODE (catch-up)", never a push's
// own node), so that no push can commit a generation meanwhile, and runs
// catchUp with the placement read under it: a copy that could not catch
// up while pushes kept moving the generation catches up in this one short
// round. It waits for a push in flight to end (holdLockWait at most).
// catchUp gets at most hold (MaxHold if 0) and returns the digest of
// node's refs once it is done; node's copy is then recorded at the
// generation if that digest is the generation's (SetReplicaGeneration),
// and the turn is given back. It tells whether the copy was recorded.
//
// Nothing is held in PostgreSQL meanwhile: the turn is a lease that
// lapses a second after hold, so a node paused or cut off while holding
// holds up pushes for that long at most, and a failover takes it away.
func HoldPushes(ctx context.Context, db *store.DB, repo, node string, hold, timeout time.Duration,
	catchUp func(ctx context.Context, pl Placement) (digest string, err error)) (bool, error) {
	if hold <= 0 {
		hold = MaxHold
	}
	holder := node + " (catch-up)"
	lease := hold + time.Second
	var turn int64
	deadline := time.Now().Add(holdLockWait)
	for {
		err := db.QueryRowContext(ctx, `UPDATE cluster_repos SET push_turn = push_turn + 1, push_holder = ?, push_until_ms = `+dbNowMS+` + ?
			WHERE name = ? AND (push_holder = '' OR push_until_ms < `+dbNowMS+`) RETURNING push_turn`,
			holder, lease.Milliseconds(), repo).Scan(&turn)
		if err == nil {
			break
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return false, fmt.Errorf("taking %s's turn of pushes: %w", repo, err)
		}
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM cluster_repos WHERE name = ?", repo).Scan(&n); err == nil && n == 0 {
			return false, fmt.Errorf("repository %s: %w", repo, ErrNotPlaced)
		}
		if time.Now().After(deadline) {
			return false, fmt.Errorf("taking %s's turn of pushes: a push is still in flight after %v", repo, holdLockWait)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	defer func() {
		// Given back whatever happened (best effort: it lapses anyway).
		rctx, cancel := store.RequestContext(context.WithoutCancel(ctx))
		db.ExecContext(rctx, "UPDATE cluster_repos SET push_holder = '', push_until_ms = 0 WHERE name = ? AND push_turn = ? AND push_holder = ?", repo, turn, holder)
		cancel()
	}()
	hctx, cancel := context.WithTimeout(ctx, hold)
	defer cancel()
	pl, err := locate(hctx, db, repo, timeout)
	if err != nil {
		return false, err
	}
	digest, err := catchUp(hctx, pl)
	if err != nil {
		return false, err
	}
	// Recorded only while the turn is still this hold's (not lapsed, not
	// taken by a failover) and the repository still at the generation
	// with that digest.
	res, err := db.ExecContext(hctx, `UPDATE replicas SET generation = ? WHERE repo = ? AND node = ?
		AND EXISTS (SELECT 1 FROM cluster_repos WHERE name = ? AND generation = ? AND (`+knownDigest("")+` IN ('', ?))
			AND push_turn = ? AND push_holder = ? AND push_until_ms >= `+dbNowMS+`)`,
		pl.Generation, repo, node, repo, pl.Generation, digest, turn, holder)
	if err != nil {
		return false, err
	}
	k, _ := res.RowsAffected()
	return k == 1, nil
}
