package cluster

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"slices"
	"strings"
	"time"

	"packwire/internal/repo"
	"packwire/internal/store"
)

// TrashedRepo is one deletion of a repository from the cluster whose
// copies are still in their nodes' trash.
type TrashedRepo struct {
	Name    string
	Deleted time.Time
	Nodes   []string // the nodes whose trash holds a copy
}

// Stamp names the deletion as repo restore --at takes it.
func (t TrashedRepo) Stamp() string { return t.Deleted.UTC().Format(repo.TrashStamp) }

type trashedCopy struct {
	node, stamp string
	deletedMS   int64
	generation  int64
	wasPrimary  bool
	// The repository's settings when it was deleted.
	head                       string
	description, quota, mirror any
}

// Trash lists the deletions whose copies are still in a node's trash
// (nodes that left the cluster not counted), oldest first.
func Trash(ctx context.Context, db *store.DB) ([]TrashedRepo, error) {
	rows, err := db.QueryContext(ctx, `SELECT t.repo, t.deleted_ms, t.node FROM cluster_trash t JOIN nodes n ON n.name = t.node
		ORDER BY t.deleted_ms, t.repo, t.node`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TrashedRepo
	for rows.Next() {
		var name, node string
		var ms int64
		if err := rows.Scan(&name, &ms, &node); err != nil {
			return nil, err
		}
		deleted := time.UnixMilli(ms).UTC()
		if n := len(out); n > 0 && out[n-1].Name == name && out[n-1].Deleted.Equal(deleted) {
			out[n-1].Nodes = append(out[n-1].Nodes, node)
			continue
		}
		out = append(out, TrashedRepo{Name: name, Deleted: deleted, Nodes: []string{node}})
	}
	return out, rows.Err()
}

// Restore places a repository deleted from the cluster again, on the
// nodes whose trash holds a copy: the deletion at stamp (TrashedRepo's
// Stamp), or the last one if stamp is "". Each copy keeps the generation
// it had, the primary's copy is primary again (else the most current
// one), and each node brings its copy back from its trash before it
// serves the repository (Restores, Restored); copies that were behind
// catch up as usual. It returns the placement.
func Restore(ctx context.Context, db *store.DB, name, stamp string) (Placement, error) {
	return RestoreWith(ctx, db, name, stamp, nil)
}

// RestoreWith is Restore, with f (nil: none) bringing back what else was
// put aside with the deletion (Follower.Deleted) in the same transaction.
func RestoreWith(ctx context.Context, db *store.DB, name, stamp string, f Follower) (Placement, error) {
	if db.Engine != store.Postgres {
		return Placement{}, ErrNotClustered
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return Placement{}, err
	}
	defer tx.Rollback()
	if err := nameFree(ctx, tx, name, ""); err != nil {
		return Placement{}, fmt.Errorf("%w (rename one of them)", err)
	}
	rows, err := tx.QueryContext(ctx, `SELECT t.node, t.stamp, t.deleted_ms, t.generation, t.was_primary, t.head, t.description, t.quota, t.mirror
		FROM cluster_trash t JOIN nodes n ON n.name = t.node
		WHERE t.repo = ? ORDER BY t.deleted_ms DESC, t.node`, name)
	if err != nil {
		return Placement{}, err
	}
	var copies []trashedCopy
	var stamps []string
	for rows.Next() {
		var c trashedCopy
		var primary int
		var desc, mirror sql.NullString
		var quota sql.NullInt64
		if err := rows.Scan(&c.node, &c.stamp, &c.deletedMS, &c.generation, &primary, &c.head, &desc, &quota, &mirror); err != nil {
			rows.Close()
			return Placement{}, err
		}
		c.wasPrimary = primary != 0
		c.description, c.quota, c.mirror = nullable(desc), nullable(quota), nullable(mirror)
		deletion := TrashedRepo{Deleted: time.UnixMilli(c.deletedMS)}.Stamp()
		if !slices.Contains(stamps, deletion) {
			stamps = append(stamps, deletion)
		}
		if stamp == "" && (len(copies) == 0 || copies[0].deletedMS == c.deletedMS) || stamp == deletion {
			copies = append(copies, c)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return Placement{}, err
	}
	if len(copies) == 0 {
		if len(stamps) > 0 {
			return Placement{}, fmt.Errorf("%s was not deleted at %s; deleted versions: %s", name, stamp, strings.Join(stamps, ", "))
		}
		return Placement{}, fmt.Errorf("%s: %w", name, repo.ErrNotInTrash)
	}
	// Two deletions within one second share a stamp: the later one.
	copies = slices.DeleteFunc(copies, func(c trashedCopy) bool { return c.deletedMS != copies[0].deletedMS })
	primary, gen := copies[0], int64(0)
	for _, c := range copies {
		gen = max(gen, c.generation)
		if c.wasPrimary && !primary.wasPrimary || c.wasPrimary == primary.wasPrimary && c.generation > primary.generation {
			primary = c
		}
	}
	// No digest: which refs the copies in the trash hold at their
	// generations is not known, so every copy's are taken as its
	// generation's until the next push writes one (digest.go).
	// committed_ms 0: no push of the primary is landing (Committing), so
	// a primary whose copy was behind catches up from a current one.
	// The settings come back numbered 1 (the copies' 0): each copy applies
	// them, a copy fetched again after its trash expired included.
	if _, err := tx.ExecContext(ctx, `INSERT INTO cluster_repos(name, primary_node, generation, created_ms, committed_ms, head, description, quota, mirror, settings)
		VALUES(?, ?, ?, `+dbNowMS+`, 0, ?, ?, ?, ?, 1)`,
		name, primary.node, gen, primary.head, primary.description, primary.quota, primary.mirror); err != nil {
		return Placement{}, err
	}
	p := Placement{Repo: name, Primary: primary.node, Generation: gen}
	for _, c := range copies {
		if _, err := tx.ExecContext(ctx, "INSERT INTO replicas(repo, node, generation) VALUES(?, ?, ?)", name, c.node, c.generation); err != nil {
			return Placement{}, err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO cluster_restores(repo, node, stamp) VALUES(?, ?, ?)", name, c.node, c.stamp); err != nil {
			return Placement{}, err
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM cluster_trash WHERE repo = ? AND node = ? AND stamp = ?", name, c.node, c.stamp); err != nil {
			return Placement{}, err
		}
		p.Replicas = append(p.Replicas, Replica{Node: c.node, Generation: c.generation})
	}
	if f != nil {
		if err := f.Restored(ctx, tx, name, TrashedRepo{Deleted: time.UnixMilli(primary.deletedMS)}.Stamp()); err != nil {
			return Placement{}, err
		}
	}
	return p, tx.Commit()
}

// A PendingRestore is a copy a node still has to bring back from its trash.
type PendingRestore struct {
	Repo, Stamp string
}

// Restores lists the copies node still has to bring back from its trash.
func Restores(ctx context.Context, db *store.DB, node string) ([]PendingRestore, error) {
	rows, err := db.QueryContext(ctx, "SELECT repo, stamp FROM cluster_restores WHERE node = ? ORDER BY repo", node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []PendingRestore
	for rows.Next() {
		var r PendingRestore
		if err := rows.Scan(&r.Repo, &r.Stamp); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Restored records that node brought its copy of repo back; lost: the
// copy was no longer in its trash (removed for good meanwhile), so the
// node's replica is marked as not made, to be fetched from a current one.
func Restored(ctx context.Context, db *store.DB, repo, node string, lost bool) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if lost {
		if _, err := tx.ExecContext(ctx, "UPDATE replicas SET generation = -1 WHERE repo = ? AND node = ?", repo, node); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM cluster_restores WHERE repo = ? AND node = ?", repo, node); err != nil {
		return err
	}
	return tx.Commit()
}

// TrashRemoved forgets a node's trashed copy removed for good (trash
// retention): it can no longer be restored.
func TrashRemoved(ctx context.Context, db *store.DB, repo, node, stamp string) error {
	_, err := db.ExecContext(ctx, "DELETE FROM cluster_trash WHERE repo = ? AND node = ? AND stamp = ?", repo, node, stamp)
	return err
}

// Arriving tells whether a copy of name is still to be brought to node's
// disk under that name: by a rename, or from its trash by a restore.
// Until then the node must not make an empty copy there.
func Arriving(ctx context.Context, db *store.DB, name, node string) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM cluster_renames WHERE node = ? AND to_name = ?)
		+ (SELECT count(*) FROM cluster_restores WHERE node = ? AND repo = ?)`, node, name, node, name).Scan(&n)
	return n > 0, err
}

// nullable is a scanned column's value (nil for NULL), for writing back.
func nullable(v driver.Valuer) any {
	x, _ := v.Value()
	return x
}
