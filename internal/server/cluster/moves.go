package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"packwire/internal/store"
)

// Moving a copy of a repository from one node to another keeps what a
// push's acknowledgement promised: every acknowledged push is on a
// majority of the copies, so a copy may go only while another one holds
// the repository's generation, and the copies counted for a push's
// majority change under the repository's row lock and push turn
// (lockRepo, after a push in flight): a push is never committed on copies
// other than those it read (BeginPush, Commit).
//
// From a healthy node the new copy is added first and made (its node
// fetches it from the primary, as for a new repository), and the old one
// is dropped only once the new one is at the repository's generation:
// meanwhile a push needs a majority of one copy more, which the old copy
// still helps make. From a node that is down (lost, being replaced) that
// majority might not be reachable, so the old copy is dropped and the new
// one added in one transaction: a push then needs a majority of the copies
// left and the new one, which the copies left make while it catches up.

// ErrMoveRefused says why a copy cannot move now; nothing was changed.
var ErrMoveRefused = errors.New("cannot move the copy")

// AddCopy places a copy of repo on node to, which makes it when it next
// reconciles (empty, then fetched from the primary). It reports whether it
// added one (false: to holds one already).
func AddCopy(ctx context.Context, db *store.DB, repo, to string, timeout time.Duration) (bool, error) {
	if db.Engine != store.Postgres {
		return false, ErrNotClustered
	}
	tx, err := lockRepo(ctx, db, repo)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var healthy bool
	if err := tx.QueryRowContext(ctx, "SELECT "+healthySQL+" FROM nodes nd WHERE nd.name = ?", timeout.Milliseconds(), to).Scan(&healthy); err != nil {
		return false, fmt.Errorf("%w: node %s: %v", ErrMoveRefused, to, noRows(err, "no such node (packwire cluster status)"))
	}
	if !healthy {
		return false, fmt.Errorf("%w: node %s is not healthy (packwire cluster status)", ErrMoveRefused, to)
	}
	res, err := tx.ExecContext(ctx, "INSERT INTO replicas(repo, node) VALUES(?, ?) ON CONFLICT (repo, node) DO NOTHING", repo, to)
	if err != nil {
		return false, err
	}
	if err := keepFiles(ctx, tx, repo, to); err != nil {
		return false, err
	}
	added, _ := res.RowsAffected()
	return added == 1, tx.Commit()
}

// DropCopy removes node from's copy of repo from the placement, under the
// repository's row lock, if another copy holds the repository's
// generation; when from is the primary, a healthy copy at the generation
// becomes primary (the epoch moves on, as in a failover, so a push the old
// primary was replicating fails rather than commits). With add set, node
// add gets a copy in the same transaction (see the top of this file).
// from's files are no longer served; its node moves them into its trash
// when it next reconciles (Dropped, TrashDropped).
func DropCopy(ctx context.Context, db *store.DB, repo, from, add string, timeout time.Duration) error {
	return dropCopy(ctx, db, repo, from, add, "", timeout)
}

// ErrCopyBehind says a move's new copy was not at the repository's
// generation when the old one was to be dropped; nothing was changed.
var ErrCopyBehind = errors.New("the new copy is behind the repository's generation")

// ReplaceCopy drops from's copy of repo as DropCopy does, but only while
// node to's copy is at the repository's generation, checked under the row
// lock that a push commits under: a push acknowledged between the new
// copy's catching up and the drop (on the old copy's help) would
// otherwise leave the moved copy behind (ErrCopyBehind: wait and retry).
func ReplaceCopy(ctx context.Context, db *store.DB, repo, from, to string, timeout time.Duration) error {
	return dropCopy(ctx, db, repo, from, "", to, timeout)
}

func dropCopy(ctx context.Context, db *store.DB, repo, from, add, mustHold string, timeout time.Duration) error {
	if db.Engine != store.Postgres {
		return ErrNotClustered
	}
	tx, err := lockRepo(ctx, db, repo)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var primary string
	var gen int64
	if err := tx.QueryRowContext(ctx, "SELECT primary_node, generation FROM cluster_repos WHERE name = ?", repo).Scan(&primary, &gen); err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, `SELECT rp.node, rp.generation, `+healthySQL+` FROM replicas rp
		JOIN nodes nd ON nd.name = rp.node WHERE rp.repo = ? ORDER BY rp.node`, timeout.Milliseconds(), repo)
	if err != nil {
		return err
	}
	var copies []Replica
	for rows.Next() {
		var r Replica
		if err := rows.Scan(&r.Node, &r.Generation, &r.Healthy); err != nil {
			rows.Close()
			return err
		}
		copies = append(copies, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	p := Placement{Repo: repo, Primary: primary, Generation: gen, Replicas: copies}
	if !p.Has(from) {
		return fmt.Errorf("%w: %s has no copy on %s", ErrMoveRefused, repo, from)
	}
	if add != "" && p.Has(add) {
		return fmt.Errorf("%w: %s has a copy on %s already", ErrMoveRefused, repo, add)
	}
	if mustHold != "" && !p.UpToDate(mustHold) {
		return fmt.Errorf("%w: %s's copy on %s", ErrCopyBehind, repo, mustHold)
	}
	var current, healthyCurrent []string
	for _, r := range copies {
		if r.Node != from && r.Generation == gen {
			current = append(current, r.Node)
			if r.Healthy {
				healthyCurrent = append(healthyCurrent, r.Node)
			}
		}
	}
	if len(current) == 0 {
		return fmt.Errorf("%w: no other copy of %s is at its generation %d: the copy on %s may hold acknowledged pushes no other has (bring %s back, or let the other copies catch up first)",
			ErrMoveRefused, repo, gen, from, from)
	}
	if primary == from {
		if len(healthyCurrent) == 0 {
			return fmt.Errorf("%w: %s's primary is on %s, and no healthy copy at its generation %d can take over", ErrMoveRefused, repo, from, gen)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE cluster_repos SET primary_node = ?, epoch = epoch + 1 WHERE name = ?", healthyCurrent[0], repo); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM replicas WHERE repo = ? AND node = ?", repo, from); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO cluster_dropped(repo, node) VALUES(?, ?) ON CONFLICT (repo, node) DO NOTHING", repo, from); err != nil {
		return err
	}
	if add != "" {
		if _, err := tx.ExecContext(ctx, "INSERT INTO replicas(repo, node) VALUES(?, ?)", repo, add); err != nil {
			return err
		}
		if err := keepFiles(ctx, tx, repo, add); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// keepFiles cancels the drop of node's files of repo, if any is pending:
// the node holds a copy again, and catching up reuses what it has.
func keepFiles(ctx context.Context, tx *store.Tx, repo, node string) error {
	_, err := tx.ExecContext(ctx, "DELETE FROM cluster_dropped WHERE repo = ? AND node = ?", repo, node)
	return err
}

// Dropped lists the repositories whose files node still has to move into
// its trash: copies the cluster moved away from it (DropCopy).
func Dropped(ctx context.Context, db *store.DB, node string) ([]string, error) {
	return queryStrings(ctx, db, "SELECT repo FROM cluster_dropped WHERE node = ? ORDER BY repo", node)
}

// TrashDropped carries out the drop of node's files of repo: under the
// repository's row lock (so the copy is not placed on node again
// meanwhile), trash moves them into the node's trash, unless node holds
// a copy again; then the drop is cleared. An error from trash leaves the
// drop for the next try.
func TrashDropped(ctx context.Context, db *store.DB, repo, node string, trash func() error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// The row may be gone (the repository deleted since): then there is
	// nothing to lock, and nothing can place a copy of it.
	if _, err := tx.ExecContext(ctx, "SELECT name FROM cluster_repos WHERE name = ? FOR UPDATE", repo); err != nil {
		return err
	}
	var placed int
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM replicas WHERE repo = ? AND node = ?", repo, node).Scan(&placed); err != nil {
		return err
	}
	if placed == 0 {
		if err := trash(); err != nil {
			return err
		}
	}
	if err := keepFiles(ctx, tx, repo, node); err != nil {
		return err
	}
	return tx.Commit()
}

// Healthy tells whether node heartbeats within timeout; false for a node
// the cluster does not know.
func Healthy(ctx context.Context, db *store.DB, node string, timeout time.Duration) (bool, error) {
	var healthy bool
	err := db.QueryRowContext(ctx, "SELECT "+healthySQL+" FROM nodes nd WHERE nd.name = ?", timeout.Milliseconds(), node).Scan(&healthy)
	if err != nil {
		return false, noRows(err, "no such node "+node+" (packwire cluster status)")
	}
	return healthy, nil
}

// CopiesOn lists the repositories with a copy on node.
func CopiesOn(ctx context.Context, db *store.DB, node string) ([]string, error) {
	return queryStrings(ctx, db, "SELECT repo FROM replicas WHERE node = ? ORDER BY repo", node)
}

// MoveTarget picks a healthy node without a copy of repo, the one with
// the fewest copies first (as Place does); "" when there is none.
func MoveTarget(ctx context.Context, db *store.DB, repo string, timeout time.Duration) (string, error) {
	nodes, err := queryStrings(ctx, db, `SELECT nd.name FROM nodes nd WHERE `+healthySQL+`
		AND NOT EXISTS (SELECT 1 FROM replicas own WHERE own.repo = ? AND own.node = nd.name)
		ORDER BY (SELECT count(*) FROM replicas rp WHERE rp.node = nd.name), nd.name LIMIT 1`, timeout.Milliseconds(), repo)
	if err != nil || len(nodes) == 0 {
		return "", err
	}
	return nodes[0], nil
}

// Forget removes node from the cluster's nodes if it holds no copy and is
// not healthy; it reports whether it did. A node that comes back joins
// again, with no copies.
func Forget(ctx context.Context, db *store.DB, node string, timeout time.Duration) (bool, error) {
	res, err := db.ExecContext(ctx, `DELETE FROM nodes WHERE name = ? AND NOT EXISTS (SELECT 1 FROM replicas WHERE node = ?)
		AND NOT (`+dbNowMS+` - heartbeat_ms <= ?)`, node, node, timeout.Milliseconds())
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// noRows turns sql.ErrNoRows into msg (nil when msg is empty).
func noRows(err error, msg string) error {
	if errors.Is(err, sql.ErrNoRows) {
		if msg == "" {
			return nil
		}
		return errors.New(msg)
	}
	return err
}

// AwaitCopy waits, at most wait, for node's copy of repo to reach the
// repository's generation, and tells whether it did.
func AwaitCopy(ctx context.Context, db *store.DB, repo, node string, wait time.Duration) (bool, error) {
	deadline := time.Now().Add(wait)
	for {
		var current bool
		err := db.QueryRowContext(ctx, `SELECT rp.generation = c.generation FROM replicas rp JOIN cluster_repos c ON c.name = rp.repo
			WHERE rp.repo = ? AND rp.node = ?`, repo, node).Scan(&current)
		if err != nil {
			return false, noRows(err, fmt.Sprintf("%s has no copy on %s", repo, node))
		}
		if current || time.Now().After(deadline) {
			return current, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// CurrentCopy is a copy recorded at its repository's generation, with
// the generation's refs digest ("" when not known).
type CurrentCopy struct{ Repo, Digest string }

// CurrentCopies lists node's copies recorded at their repository's
// generation.
func CurrentCopies(ctx context.Context, db *store.DB, node string) ([]CurrentCopy, error) {
	rows, err := db.QueryContext(ctx, `SELECT c.name, `+knownDigest("c.")+` FROM replicas rp JOIN cluster_repos c ON c.name = rp.repo
		WHERE rp.node = ? AND rp.generation = c.generation ORDER BY c.name`, node)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []CurrentCopy
	for rows.Next() {
		var c CurrentCopy
		if err := rows.Scan(&c.Repo, &c.Digest); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}
