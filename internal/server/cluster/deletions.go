package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"packwire/internal/store"
)

// Delete removes a repository from the cluster in one transaction: its
// placement goes (clients get "not found" from every node at once; a push
// in flight finds no placement and is refused), and each node that held a
// copy is left a deletion to carry out, moving its copy into its own trash
// when it next reconciles (Deletions, Deleted). It returns those nodes.
func Delete(ctx context.Context, db *store.DB, repo string) ([]string, error) {
	return DeleteWith(ctx, db, repo, nil)
}

// DeleteWith is Delete, with f (nil: none) putting aside what else is
// kept under the repository's name in the same transaction.
func DeleteWith(ctx context.Context, db *store.DB, repo string, f Follower) ([]string, error) {
	if db.Engine != store.Postgres {
		return nil, ErrNotClustered
	}
	tx, err := lockRepo(ctx, db, repo)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	nodes, err := queryStrings(ctx, tx, "SELECT node FROM replicas WHERE repo = ? ORDER BY node", repo)
	if err != nil {
		return nil, err
	}
	// One time for every copy: what repo restore names the deletion by.
	var now int64
	if err := tx.QueryRowContext(ctx, "SELECT "+dbNowMS).Scan(&now); err != nil {
		return nil, err
	}
	// Each copy's generation goes with it into its node's trash, so that a
	// restore knows which copies are current, and so do the repository's
	// settings (a copy fetched again after its trash expired gets them).
	if _, err := tx.ExecContext(ctx, `INSERT INTO cluster_deletions(repo, node, deleted_ms, generation, was_primary, head, description, quota, mirror)
		SELECT rp.repo, rp.node, ?, rp.generation, CASE WHEN c.primary_node = rp.node THEN 1 ELSE 0 END, c.head, c.description, c.quota, c.mirror
		FROM replicas rp JOIN cluster_repos c ON c.name = rp.repo WHERE rp.repo = ?
		ON CONFLICT(repo, node) DO NOTHING`, now, repo); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM cluster_repos WHERE name = ?", repo); err != nil {
		return nil, err
	}
	if f != nil {
		if err := f.Deleted(ctx, tx, repo, TrashedRepo{Deleted: time.UnixMilli(now)}.Stamp()); err != nil {
			return nil, err
		}
	}
	return nodes, tx.Commit()
}

// A Follower moves what is kept under a repository's name outside the
// cluster's own tables, in the cluster's database (Git LFS's index:
// lfs.ClusterRows), in the transaction in which the cluster renames,
// deletes or restores the repository: it follows the name at the moment
// every node does. stamp names a deletion as TrashedRepo.Stamp does.
type Follower interface {
	Renamed(ctx context.Context, tx *store.Tx, from, to string) error
	Deleted(ctx context.Context, tx *store.Tx, name, stamp string) error
	Restored(ctx context.Context, tx *store.Tx, name, stamp string) error
}

// Restorable tells whether repo restore can still bring back the deletion
// of name at stamp (TrashedRepo.Stamp): a node of the cluster holds its
// copy in its trash, or has still to move it there. Once not, what was put
// aside with it (Follower.Deleted) may go.
func Restorable(ctx context.Context, db *store.DB, name, stamp string) (bool, error) {
	times, err := queryStrings(ctx, db, `SELECT CAST(t.deleted_ms AS TEXT) FROM cluster_trash t JOIN nodes n ON n.name = t.node WHERE t.repo = ?
		UNION SELECT CAST(d.deleted_ms AS TEXT) FROM cluster_deletions d JOIN nodes n ON n.name = d.node WHERE d.repo = ?`, name, name)
	if err != nil {
		return false, err
	}
	for _, v := range times {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return false, err
		}
		if (TrashedRepo{Deleted: time.UnixMilli(ms)}).Stamp() == stamp {
			return true, nil
		}
	}
	return false, nil
}

// lockRepo begins a transaction holding repo's row lock and its push
// turn: what the transaction changes (the copies, the name, the row
// itself) must not change under a push between its replication and its
// commit. A push in flight is waited for, up to pushWait, with the row
// unlocked (its commit needs it); one still in flight then (its
// replication stuck) has its turn taken away, and is refused when it
// commits rather than committed across the change. ErrNotPlaced if the
// cluster has no such repository.
func lockRepo(ctx context.Context, db *store.DB, repo string) (*store.Tx, error) {
	deadline := time.Now().Add(pushWait)
	for {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		var inFlight bool
		err = tx.QueryRowContext(ctx, "SELECT push_holder <> '' AND push_until_ms >= "+dbNowMS+" FROM cluster_repos WHERE name = ? FOR UPDATE", repo).Scan(&inFlight)
		if errors.Is(err, sql.ErrNoRows) {
			err = fmt.Errorf("repository %s: %w", repo, ErrNotPlaced)
		}
		if err == nil && (!inFlight || time.Now().After(deadline)) {
			_, err = tx.ExecContext(ctx, "UPDATE cluster_repos SET push_turn = push_turn + 1, push_holder = '', push_until_ms = 0 WHERE name = ?", repo)
			if err == nil {
				return tx, nil
			}
		}
		tx.Rollback()
		if err != nil {
			return nil, err
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// pushWait bounds lockRepo's wait for a push in flight: pushes take
// milliseconds; one that takes longer is stuck replicating.
var pushWait = 10 * time.Second

// Deletions lists the repositories node still has to move into its trash.
func Deletions(ctx context.Context, db *store.DB, node string) ([]string, error) {
	return queryStrings(ctx, db, "SELECT repo FROM cluster_deletions WHERE node = ? ORDER BY repo", node)
}

// MovingAway tells whether node still has to move its copy of name away:
// deleted from the cluster (to its trash) or renamed (to the new name).
func MovingAway(ctx context.Context, db *store.DB, name, node string) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM cluster_deletions WHERE repo = ? AND node = ?)
		+ (SELECT count(*) FROM cluster_renames WHERE from_name = ? AND node = ?)`, name, node, name, node).Scan(&n)
	return n > 0, err
}

// Deleted records that node has moved its copy of repo away: into its
// trash as stamp (for a restore), or nowhere ("": it had no copy).
func Deleted(ctx context.Context, db *store.DB, repo, node, stamp string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if stamp != "" {
		if _, err := tx.ExecContext(ctx, `INSERT INTO cluster_trash(repo, node, stamp, deleted_ms, generation, was_primary, head, description, quota, mirror)
			SELECT repo, node, ?, deleted_ms, generation, was_primary, head, description, quota, mirror FROM cluster_deletions WHERE repo = ? AND node = ?
			ON CONFLICT(repo, node, stamp) DO NOTHING`, stamp, repo, node); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM cluster_deletions WHERE repo = ? AND node = ?", repo, node); err != nil {
		return err
	}
	return tx.Commit()
}

// pendingDeletion refuses to place repo again while a node still has to
// delete an earlier copy of that name: it would delete the new one.
func pendingDeletion(ctx context.Context, tx *store.Tx, repo string) error {
	nodes, err := queryStrings(ctx, tx, "SELECT node FROM cluster_deletions WHERE repo = ? ORDER BY node", repo)
	if err != nil {
		return err
	}
	if len(nodes) > 0 {
		return fmt.Errorf("repository %s was deleted and node %s has not moved its copy into its trash yet (it does when it runs); retry shortly",
			repo, strings.Join(nodes, ", "))
	}
	return nil
}

// querier is a *store.DB or a *store.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// queryStrings runs a query of one text column and returns its values.
func queryStrings(ctx context.Context, q querier, query string, args ...any) ([]string, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
