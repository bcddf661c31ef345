package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"packwire/internal/store"
)

// Settings are a repository's settings kept in git's own files on each
// copy rather than in refs, so that replication does not carry them: the
// branch HEAD names and the description. The cluster keeps them in its
// row with a number that each change increments; every node applies them
// to its copy when its number is behind (route's Reconcile).
type Settings struct {
	Head        string  // "": as the copy was created
	Description *string // nil: as the copy was created
	Number      int64
}

// SetSettings changes a repository's head (if not "") and description
// (if not nil) for every copy, and returns the new settings.
func SetSettings(ctx context.Context, db *store.DB, repo, head string, description *string) (Settings, error) {
	if db.Engine != store.Postgres {
		return Settings{}, ErrNotClustered
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return Settings{}, err
	}
	defer tx.Rollback()
	var st Settings
	var desc sql.NullString
	err = tx.QueryRowContext(ctx, "SELECT head, description, settings FROM cluster_repos WHERE name = ? FOR UPDATE", repo).Scan(&st.Head, &desc, &st.Number)
	if errors.Is(err, sql.ErrNoRows) {
		return st, fmt.Errorf("repository %s: %w", repo, ErrNotPlaced)
	}
	if err != nil {
		return st, err
	}
	if desc.Valid {
		st.Description = &desc.String
	}
	if head != "" {
		st.Head = head
	}
	if description != nil {
		st.Description = description
	}
	st.Number++
	var descArg any
	if st.Description != nil {
		descArg = *st.Description
	}
	if _, err := tx.ExecContext(ctx, "UPDATE cluster_repos SET head = ?, description = ?, settings = ? WHERE name = ?", st.Head, descArg, st.Number, repo); err != nil {
		return st, err
	}
	return st, tx.Commit()
}

// StaleSettings lists node's copies whose settings are behind, with the
// settings to apply.
func StaleSettings(ctx context.Context, db *store.DB, node string) (map[string]Settings, error) {
	rows, err := db.QueryContext(ctx, `SELECT c.name, c.head, c.description, c.settings FROM replicas rp
		JOIN cluster_repos c ON c.name = rp.repo WHERE rp.node = ? AND rp.generation >= 0 AND rp.settings <> c.settings`, node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	stale := map[string]Settings{}
	for rows.Next() {
		var name string
		var st Settings
		var desc sql.NullString
		if err := rows.Scan(&name, &st.Head, &desc, &st.Number); err != nil {
			return nil, err
		}
		if desc.Valid {
			st.Description = &desc.String
		}
		stale[name] = st
	}
	return stale, rows.Err()
}

// SettingsApplied records that node's copy of repo has settings number n.
func SettingsApplied(ctx context.Context, db *store.DB, repo, node string, n int64) error {
	_, err := db.ExecContext(ctx, "UPDATE replicas SET settings = ? WHERE repo = ? AND node = ?", n, repo, node)
	return err
}

// PrimaryBranches lists the branches of repo's primary copy, read through
// its node as the cluster user (repo set-head checks the branch exists).
func PrimaryBranches(ctx context.Context, db *store.DB, secret, repo string, timeout time.Duration) ([]string, error) {
	pl, err := Locate(ctx, db, repo, timeout)
	if err != nil {
		return nil, err
	}
	primary, ok := pl.Replica(pl.Primary)
	if !ok {
		return nil, fmt.Errorf("repository %s has no primary copy", repo)
	}
	refs, err := lsRemote(ctx, RepoURL(primary.URL, repo), secret)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", primary.Node, err)
	}
	var branches []string
	for _, r := range refs {
		if _, ref, ok := strings.Cut(r, " "); ok && strings.HasPrefix(ref, "refs/heads/") {
			branches = append(branches, strings.TrimPrefix(ref, "refs/heads/"))
		}
	}
	return branches, nil
}
