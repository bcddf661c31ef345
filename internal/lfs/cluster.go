package lfs

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"packwire/internal/store"
)

// A cluster's nodes serve every repository, so every node must serve
// every LFS object: the objects live in a store they share (S3) and the
// index in their PostgreSQL database (Service.Database), so that an
// object is acknowledged to a client only once the store has it and the
// shared index says so.

// ClusterNeedsStore is why LFS is off on a cluster node without a
// shared store.
func ClusterNeedsStore(node string) string {
	return fmt.Sprintf("Git LFS is off on cluster node %s: a cluster's nodes must share the LFS store; start every node with --lfs-store s3://BUCKET?endpoint=... (or --lfs=false)", node)
}

// Refuse answers every LFS request with why LFS is off (501, in LFS's
// error format), rather than a bare 404 that git-lfs would report as a
// missing repository.
func Refuse(why string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{http.StatusNotImplemented, why})
	})
}

// ClusterRows moves a repository's rows of the cluster's index (schema
// PostgresSchema) in the transaction in which the cluster renames,
// deletes or restores the repository (cluster.Follower), so that its
// objects are served under its new name and no longer under its old one
// from the moment every node answers for the new: a deleted repository's
// go under its trash name (a new repository of the name reads none), a
// restored one's come back. The tables may not exist yet (no node has
// served LFS): then there is nothing to move.
type ClusterRows struct{}

// Renamed moves the rows of a renamed repository.
func (ClusterRows) Renamed(ctx context.Context, tx *store.Tx, from, to string) error {
	return moveClusterRows(ctx, tx, from, to)
}

// Deleted puts a deleted repository's rows aside under its trash name;
// stamp names the deletion (what repo restore --at takes).
func (ClusterRows) Deleted(ctx context.Context, tx *store.Tx, name, stamp string) error {
	return moveClusterRows(ctx, tx, name, trashName(name, stamp))
}

// Restored brings a restored repository's rows back.
func (ClusterRows) Restored(ctx context.Context, tx *store.Tx, name, stamp string) error {
	return moveClusterRows(ctx, tx, trashName(name, stamp), name)
}

// moveClusterRows gives from's rows the name to. Should to hold the same
// object or lock a path already (two deletions of one name within the
// second share a trash name), to's row stays and from's goes.
func moveClusterRows(ctx context.Context, tx *store.Tx, from, to string) error {
	var exists bool
	if err := tx.QueryRowContext(ctx, "SELECT to_regclass(?) IS NOT NULL", PostgresSchema+".lfs_objects").Scan(&exists); err != nil || !exists {
		return err
	}
	objects, locks := PostgresSchema+".lfs_objects", PostgresSchema+".lfs_locks"
	for _, st := range []struct {
		q    string
		args []any
	}{
		{"INSERT INTO " + objects + "(repo, oid, size, created_ms) SELECT ?, oid, size, created_ms FROM " + objects + " WHERE repo = ? ON CONFLICT DO NOTHING", []any{to, from}},
		{"DELETE FROM " + objects + " WHERE repo = ?", []any{from}},
		{"UPDATE " + locks + " l SET repo = ? WHERE repo = ? AND NOT EXISTS (SELECT 1 FROM " + locks + " t WHERE t.repo = ? AND t.path = l.path)", []any{to, from, to}},
		{"DELETE FROM " + locks + " WHERE repo = ?", []any{from}},
	} {
		if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
			return fmt.Errorf("lfs index: moving %s's rows to %s: %w", from, to, err)
		}
	}
	return nil
}

// ForgetDeleted removes the index rows of deletions that can no longer
// be restored (restorable says, by the repository's name and the
// deletion's stamp): their trash entries expired, or no node held a copy.
// Sweep then removes the objects no repository holds any more.
func (x *Index) ForgetDeleted(ctx context.Context, restorable func(name, stamp string) (bool, error)) (int, error) {
	names, err := x.trashNames(ctx)
	if err != nil {
		return 0, err
	}
	forgotten := 0
	for _, trashed := range names {
		stamp, name, ok := strings.Cut(strings.TrimPrefix(trashed, trashPrefix), "/")
		if !ok {
			continue
		}
		keep, err := restorable(name, stamp)
		if err != nil {
			return forgotten, err
		}
		if keep {
			continue
		}
		if err := x.RemoveRepo(ctx, trashed); err != nil {
			return forgotten, err
		}
		forgotten++
	}
	return forgotten, nil
}
