package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"packwire/internal/store"
)

// Settings are a repository's settings kept in git's own files on each
// copy rather than in refs, so that replication does not carry them: the
// branch HEAD names, the description, the quota (packwire.quota in its
// config), the mirroring with its credentials (a mirror.Spec as JSON).
// The cluster keeps them in its row with a number that each change
// increments; every node applies them to its copy when its number
// is behind (route's Reconcile).
type Settings struct {
	Head        string  // "": as the copy was created
	Description *string // nil: as the copy was created
	Quota       *int64  // nil: as the copy was created; 0: none
	Mirror      *string // nil: as the copy was created; else a mirror.Spec
	Number      int64
}

// Change is what SetSettings changes: the fields set (not "" or nil).
type Change struct {
	Head        string
	Description *string
	Quota       *int64
	Mirror      *string
}

// SetSettings applies a change to a repository's settings for every copy,
// and returns the new settings.
func SetSettings(ctx context.Context, db *store.DB, repo string, change Change) (Settings, error) {
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
	var quota sql.NullInt64
	var mirror sql.NullString
	err = tx.QueryRowContext(ctx, "SELECT head, description, quota, mirror, settings FROM cluster_repos WHERE name = ? FOR UPDATE", repo).Scan(&st.Head, &desc, &quota, &mirror, &st.Number)
	if errors.Is(err, sql.ErrNoRows) {
		return st, fmt.Errorf("repository %s: %w", repo, ErrNotPlaced)
	}
	if err != nil {
		return st, err
	}
	st.Description, st.Quota, st.Mirror = nullString(desc), nullInt(quota), nullString(mirror)
	if change.Head != "" {
		st.Head = change.Head
	}
	if change.Description != nil {
		st.Description = change.Description
	}
	if change.Quota != nil {
		st.Quota = change.Quota
	}
	if change.Mirror != nil {
		st.Mirror = change.Mirror
	}
	st.Number++
	var descArg, quotaArg, mirrorArg any
	if st.Description != nil {
		descArg = *st.Description
	}
	if st.Quota != nil {
		quotaArg = *st.Quota
	}
	if st.Mirror != nil {
		mirrorArg = *st.Mirror
	}
	if _, err := tx.ExecContext(ctx, "UPDATE cluster_repos SET head = ?, description = ?, quota = ?, mirror = ?, settings = ? WHERE name = ?",
		st.Head, descArg, quotaArg, mirrorArg, st.Number, repo); err != nil {
		return st, err
	}
	return st, tx.Commit()
}

// RepoSettings reads a repository's settings.
func RepoSettings(ctx context.Context, db *store.DB, repo string) (Settings, error) {
	var st Settings
	var desc sql.NullString
	var quota sql.NullInt64
	var mirror sql.NullString
	err := db.QueryRowContext(ctx, "SELECT head, description, quota, mirror, settings FROM cluster_repos WHERE name = ?", repo).Scan(&st.Head, &desc, &quota, &mirror, &st.Number)
	if errors.Is(err, sql.ErrNoRows) {
		return st, fmt.Errorf("repository %s: %w", repo, ErrNotPlaced)
	}
	st.Description, st.Quota, st.Mirror = nullString(desc), nullInt(quota), nullString(mirror)
	return st, err
}

func nullString(v sql.NullString) *string {
	if !v.Valid {
		return nil
	}
	return &v.String
}

func nullInt(v sql.NullInt64) *int64 {
	if !v.Valid {
		return nil
	}
	return &v.Int64
}

// StaleSettings lists node's copies whose settings are behind, with the
// settings to apply.
func StaleSettings(ctx context.Context, db *store.DB, node string) (map[string]Settings, error) {
	rows, err := db.QueryContext(ctx, `SELECT c.name, c.head, c.description, c.quota, c.mirror, c.settings FROM replicas rp
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
		var quota sql.NullInt64
		var mirror sql.NullString
		if err := rows.Scan(&name, &st.Head, &desc, &quota, &mirror, &st.Number); err != nil {
			return nil, err
		}
		st.Description, st.Quota, st.Mirror = nullString(desc), nullInt(quota), nullString(mirror)
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
	for ref := range refs {
		if strings.HasPrefix(ref, "refs/heads/") {
			branches = append(branches, strings.TrimPrefix(ref, "refs/heads/"))
		}
	}
	sort.Strings(branches)
	return branches, nil
}

// PrimaryApplied tells whether repo's primary copy has applied settings
// number n (or a later one).
func PrimaryApplied(ctx context.Context, db *store.DB, repo string, n int64) (bool, error) {
	var applied bool
	err := db.QueryRowContext(ctx, `SELECT rp.settings >= ? FROM cluster_repos c JOIN replicas rp ON rp.repo = c.name AND rp.node = c.primary_node
		WHERE c.name = ?`, n, repo).Scan(&applied)
	if errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("repository %s: %w", repo, ErrNotPlaced)
	}
	return applied, err
}
