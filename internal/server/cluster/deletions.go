package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"packwire/internal/store"
)

// Delete removes a repository from the cluster in one transaction: its
// placement goes (clients get "not found" from every node at once; a push
// in flight finds no placement and is refused), and each node that held a
// copy is left a deletion to carry out, moving its copy into its own trash
// when it next reconciles (Deletions, Deleted). It returns those nodes.
func Delete(ctx context.Context, db *store.DB, repo string) ([]string, error) {
	if db.Engine != store.Postgres {
		return nil, ErrNotClustered
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	// The row lock waits for a push replicating now (its hook holds it).
	var name string
	err = tx.QueryRowContext(ctx, "SELECT name FROM cluster_repos WHERE name = ? FOR UPDATE", repo).Scan(&name)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("repository %s: %w", repo, ErrNotPlaced)
	}
	if err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, "SELECT node FROM replicas WHERE repo = ? ORDER BY node", repo)
	if err != nil {
		return nil, err
	}
	var nodes []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, err
		}
		nodes = append(nodes, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if _, err := tx.ExecContext(ctx, "INSERT INTO cluster_deletions(repo, node, deleted_ms) VALUES(?, ?, "+dbNowMS+") ON CONFLICT(repo, node) DO NOTHING", repo, n); err != nil {
			return nil, err
		}
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM cluster_repos WHERE name = ?", repo); err != nil {
		return nil, err
	}
	return nodes, tx.Commit()
}

// Deletions lists the repositories node still has to move into its trash.
func Deletions(ctx context.Context, db *store.DB, node string) ([]string, error) {
	rows, err := db.QueryContext(ctx, "SELECT repo FROM cluster_deletions WHERE node = ? ORDER BY repo", node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var repos []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			return nil, err
		}
		repos = append(repos, r)
	}
	return repos, rows.Err()
}

// Deleting tells whether node still has to delete its copy of repo: the
// copy is on its disk but no longer the cluster's.
func Deleting(ctx context.Context, db *store.DB, repo, node string) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, "SELECT count(*) FROM cluster_deletions WHERE repo = ? AND node = ?", repo, node).Scan(&n)
	return n > 0, err
}

// Deleted records that node has moved its copy of repo away.
func Deleted(ctx context.Context, db *store.DB, repo, node string) error {
	_, err := db.ExecContext(ctx, "DELETE FROM cluster_deletions WHERE repo = ? AND node = ?", repo, node)
	return err
}

// pendingDeletion refuses to place repo again while a node still has to
// delete an earlier copy of that name: it would delete the new one.
func pendingDeletion(ctx context.Context, tx *store.Tx, repo string) error {
	rows, err := tx.QueryContext(ctx, "SELECT node FROM cluster_deletions WHERE repo = ? ORDER BY node", repo)
	if err != nil {
		return err
	}
	var nodes []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return err
		}
		nodes = append(nodes, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(nodes) > 0 {
		return fmt.Errorf("repository %s was deleted and node %s has not moved its copy into its trash yet (it does when it runs); retry shortly",
			repo, strings.Join(nodes, ", "))
	}
	return nil
}
