package cluster

import (
	"context"
	"fmt"
	"strings"

	"packwire/internal/store"
)

// Rename gives a repository of the cluster a new name in one transaction:
// its row, placement, generations and settings move to the new name at
// once (every node answers for the new name from then on and "not found"
// for the old), and each node that holds a copy is left a rename to
// carry out on its disk (Renames, Renamed): before it serves the new
// name, or when it next reconciles. It returns those nodes.
func Rename(ctx context.Context, db *store.DB, from, to string) ([]string, error) {
	return RenameWith(ctx, db, from, to, nil)
}

// RenameWith is Rename, with f (nil: none) moving what else is kept under
// the repository's name in the same transaction.
func RenameWith(ctx context.Context, db *store.DB, from, to string, f Follower) ([]string, error) {
	if db.Engine != store.Postgres {
		return nil, ErrNotClustered
	}
	if from == to {
		return nil, fmt.Errorf("%s is already its name", to)
	}
	tx, err := lockRepo(ctx, db, from)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	if err := nameFree(ctx, tx, to, from); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO cluster_repos(name, primary_node, generation, digest, digest_generation, epoch, created_ms, committed_ms, source, head, description, quota, mirror, settings)
		SELECT ?, primary_node, generation, digest, digest_generation, epoch, created_ms, committed_ms, source, head, description, quota, mirror, settings FROM cluster_repos WHERE name = ?`, to, from); err != nil {
		if store.IsUnique(err) {
			return nil, fmt.Errorf("repository %s: %w", to, store.ErrExists)
		}
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE replicas SET repo = ? WHERE repo = ?", to, from); err != nil {
		return nil, err
	}
	nodes, err := queryStrings(ctx, tx, "SELECT node FROM replicas WHERE repo = ? ORDER BY node", to)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if _, err := tx.ExecContext(ctx, "INSERT INTO cluster_renames(from_name, to_name, node, renamed_ms) VALUES(?, ?, ?, "+dbNowMS+")", from, to, n); err != nil {
			return nil, err
		}
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM cluster_repos WHERE name = ?", from); err != nil {
		return nil, err
	}
	if f != nil {
		if err := f.Renamed(ctx, tx, from, to); err != nil {
			return nil, err
		}
	}
	return nodes, tx.Commit()
}

// nameFree refuses to give a repository the name to (other than the one
// being renamed, except): taken, nested in or holding another repository
// of the cluster (a copy could not be made inside another), or still
// waiting for a node to move an earlier copy of that name away.
func nameFree(ctx context.Context, tx *store.Tx, to, except string) error {
	taken, err := queryStrings(ctx, tx, `SELECT name FROM cluster_repos WHERE name <> ? AND (name = ?
		OR substr(?, 1, length(name) + 1) = name || '/' OR substr(name, 1, length(?) + 1) = ? || '/') ORDER BY name LIMIT 1`,
		except, to, to, to, to)
	if err != nil {
		return err
	}
	if len(taken) > 0 {
		if taken[0] == to {
			return fmt.Errorf("repository %s: %w", to, store.ErrExists)
		}
		return fmt.Errorf("%s would be nested in or hold repository %s", to, taken[0])
	}
	if err := pendingDeletion(ctx, tx, to); err != nil {
		return err
	}
	nodes, err := queryStrings(ctx, tx, "SELECT node FROM cluster_renames WHERE from_name = ? ORDER BY node", to)
	if err != nil {
		return err
	}
	if len(nodes) > 0 {
		return fmt.Errorf("a repository was renamed from %s and node %s has not moved its copy yet (it does when it runs); retry shortly",
			to, strings.Join(nodes, ", "))
	}
	return nil
}

// A PendingRename is a rename a node still has to carry out on its disk.
type PendingRename struct {
	ID       int64
	From, To string
}

// Renames lists the renames node still has to carry out, oldest first
// (a repository renamed twice is moved twice, in order).
func Renames(ctx context.Context, db *store.DB, node string) ([]PendingRename, error) {
	rows, err := db.QueryContext(ctx, "SELECT id, from_name, to_name FROM cluster_renames WHERE node = ? ORDER BY id", node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []PendingRename
	for rows.Next() {
		var r PendingRename
		if err := rows.Scan(&r.ID, &r.From, &r.To); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Renamed records that node has carried out a rename.
func Renamed(ctx context.Context, db *store.DB, id int64) error {
	_, err := db.ExecContext(ctx, "DELETE FROM cluster_renames WHERE id = ?", id)
	return err
}
