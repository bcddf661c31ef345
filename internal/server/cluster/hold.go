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

// HoldPushes takes the repository's turn of pushes, as a push does
// (BeginPush: the repository's row locked), so that no push can commit a
// generation meanwhile, and runs catchUp with the placement read under
// it: a copy that could not catch up while pushes kept moving the
// generation catches up in this one short round. catchUp gets at most
// hold (MaxHold if 0) and returns the digest of node's refs once it is
// done; node's copy is then recorded at the generation if that digest is
// the generation's (SetReplicaGeneration), and the turn is given back.
// It tells whether the copy was recorded.
//
// The hold is bounded on PostgreSQL's side too: a node paused or cut off
// while holding loses the turn (idle_in_transaction_session_timeout).
func HoldPushes(ctx context.Context, db *store.DB, repo, node string, hold, timeout time.Duration,
	catchUp func(ctx context.Context, pl Placement) (digest string, err error)) (bool, error) {
	if hold <= 0 {
		hold = MaxHold
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", holdLockWait.Milliseconds())); err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", (hold+time.Second).Milliseconds())); err != nil {
		return false, err
	}
	var gen int64
	err = tx.QueryRowContext(ctx, "SELECT generation FROM cluster_repos WHERE name = ? FOR UPDATE", repo).Scan(&gen)
	if errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("repository %s: %w", repo, ErrNotPlaced)
	}
	if err != nil {
		return false, fmt.Errorf("taking %s's turn of pushes: %w", repo, err)
	}
	hctx, cancel := context.WithTimeout(ctx, hold)
	defer cancel()
	pl, err := locate(hctx, tx, repo, timeout)
	if err != nil {
		return false, err
	}
	digest, err := catchUp(hctx, pl)
	if err != nil {
		return false, err
	}
	ok, err := setReplicaGeneration(hctx, tx, repo, node, pl.Generation, digest)
	if err != nil || !ok {
		return false, err
	}
	return true, tx.Commit()
}
