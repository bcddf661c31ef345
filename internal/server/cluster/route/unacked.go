package route

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"packwire/internal/server/cluster"
)

// undoStranded finds this node's copies that are recorded at their
// repository's generation and hold a replication made from it that was
// never committed (undo.go), and undoes it with the repository's pushes
// held. A copy being caught up, or a new primary's own copy, undoes such
// a replication on its way (bringTo, replicate); this is for the copies
// no push or catch-up comes to: until undone, a read from them shows a
// push that was never acknowledged, and no other copy can be caught up
// from them.
//
// It runs on every tick (Reconcile) and costs a stat per copy when there
// is nothing to do: a kept replication found not to concern the
// generation is not read again while neither changes. The push turn is
// taken only for one kept unackedAge ago or more: a live primary commits
// within milliseconds of its majority (holding the turn for a push in
// flight would only wait for it).
func (rt *Router) undoStranded(ctx context.Context) error {
	current, err := cluster.CurrentCopies(ctx, rt.Node.DB, rt.Node.Name)
	if err != nil {
		return err
	}
	// Reconcile's alone: one pass at a time. Rebuilt each pass, so a copy
	// gone leaves nothing behind.
	rt.mu.Lock()
	prev := rt.unackedSeen
	rt.mu.Unlock()
	next := map[string]string{}
	defer func() {
		rt.mu.Lock()
		rt.unackedSeen = next
		rt.mu.Unlock()
	}()
	var errs []error
	for _, c := range current {
		r, err := rt.Repos.Resolve(c.Repo)
		if err != nil || c.Digest == "" {
			continue
		}
		fi, err := os.Stat(filepath.Join(r.Path, undoFile))
		if err != nil {
			continue
		}
		if time.Since(fi.ModTime()) < unackedAge {
			continue // looked at again next tick
		}
		seen := fi.ModTime().String() + " " + c.Digest
		if prev[r.Path] == seen {
			next[r.Path] = seen
			continue
		}
		last, err := readLastReplication(r.Path)
		if err != nil || last.before != c.Digest {
			next[r.Path] = seen
			continue
		}
		if digest, err := cluster.CopyDigest(r.Path); err != nil || digest != last.after {
			// The refs moved on (this copy's own pushes as a primary): only
			// a new replication, which keeps a new one, brings it back.
			if err == nil {
				next[r.Path] = seen
			}
			continue
		}
		_, err = cluster.HoldPushes(ctx, rt.Node.DB, c.Repo, rt.Node.Name, cluster.MaxHold, rt.Node.NodeTimeout(),
			func(ctx context.Context, pl cluster.Placement) (string, error) {
				writes, err := lockRefWrites(ctx, r.Path)
				if err != nil {
					return "", err
				}
				defer writes.Release()
				digest, err := undoLastReplication(ctx, r.Path, pl.Digest)
				if err == nil {
					rt.Node.Log.Warn("cluster: undid a replication its primary never committed", "repo", c.Repo, "generation", pl.Generation)
					return digest, nil
				}
				if !errors.Is(err, errNothingToUndo) {
					return "", err
				}
				// Committed meanwhile (the hold waited for its turn): the
				// copy is recorded at the generation its refs have.
				return cluster.CopyDigest(r.Path)
			})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.Repo, err))
		}
	}
	return errors.Join(errs...)
}

// unackedAge is how old a kept replication must be before undoStranded
// takes the repository's push turn to look at it.
const unackedAge = 2 * time.Second
