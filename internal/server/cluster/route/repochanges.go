package route

import (
	"context"
	"errors"
	"fmt"
	"time"

	"packwire/internal/lifecycle"
	"packwire/internal/mirror"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
)

// carryOutDeletions moves this node's copies of repositories deleted from
// the cluster into its trash (as repo delete does on one server), then
// clears each deletion. A copy busy with a push, maintenance or a backup
// is left for the next run.
func (rt *Router) carryOutDeletions(ctx context.Context) error {
	rt.moving.Lock()
	defer rt.moving.Unlock()
	names, err := cluster.Deletions(ctx, rt.Node.DB, rt.Node.Name)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		t, err := lifecycle.Delete(rt.Repos, name, time.Now())
		stamp := ""
		switch {
		case err == nil:
			stamp = t.Stamp()
		case !errors.Is(err, repo.ErrNotFound):
			errs = append(errs, fmt.Errorf("deleting %s: %w", name, err))
			continue
		default:
			// No copy under the name yet: one renamed to it (or restored)
			// and not moved here yet is still to come, and must go to the
			// trash, not be recorded as never made.
			arriving, err := cluster.Arriving(ctx, rt.Node.DB, name, rt.Node.Name)
			if err != nil || arriving {
				errs = append(errs, err)
				continue
			}
		}
		if err := cluster.Deleted(ctx, rt.Node.DB, name, rt.Node.Name, stamp); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// carryOutDrops moves the files of copies the cluster moved away from
// this node (cluster move, evacuate) into its trash, where they stay for
// the trash's retention; one busy (a push, maintenance, a backup) is left
// for the next run, and one placed here again is kept.
func (rt *Router) carryOutDrops(ctx context.Context) error {
	rt.moving.Lock()
	defer rt.moving.Unlock()
	names, err := cluster.Dropped(ctx, rt.Node.DB, rt.Node.Name)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		err := cluster.TrashDropped(ctx, rt.Node.DB, name, rt.Node.Name, func() error {
			_, err := lifecycle.Delete(rt.Repos, name, time.Now())
			if errors.Is(err, repo.ErrNotFound) {
				return nil // never made here, or gone already
			}
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("moving %s's dropped copy to the trash: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// carryOutRenames moves this node's copies of repositories renamed in the
// cluster to their new names (as repo rename does on one server), oldest
// first, then clears each rename. A copy busy with a push, maintenance or
// a backup is left for the next run; so are the renames after it.
func (rt *Router) carryOutRenames(ctx context.Context) error {
	rt.moving.Lock()
	defer rt.moving.Unlock()
	renames, err := cluster.Renames(ctx, rt.Node.DB, rt.Node.Name)
	if err != nil {
		return err
	}
	for _, r := range renames {
		_, _, err := lifecycle.Rename(rt.Repos, r.From, r.To)
		if errors.Is(err, repo.ErrNotFound) {
			// No copy made here yet (or moved already): catching up makes
			// one under the new name.
			err = nil
		}
		if err != nil {
			return fmt.Errorf("renaming %s to %s: %w", r.From, r.To, err)
		}
		if err := cluster.Renamed(ctx, rt.Node.DB, r.ID); err != nil {
			return err
		}
	}
	return nil
}

// carryOutRestores brings this node's copies of repositories restored in
// the cluster back from its trash (as repo restore does on one server). A
// copy no longer there (removed for good meanwhile) is recorded as lost,
// to be fetched from a current copy.
func (rt *Router) carryOutRestores(ctx context.Context) error {
	rt.moving.Lock()
	defer rt.moving.Unlock()
	restores, err := cluster.Restores(ctx, rt.Node.DB, rt.Node.Name)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range restores {
		_, _, err := lifecycle.Restore(rt.Repos, r.Repo, r.Stamp)
		lost := err != nil && rt.trashLost(r)
		if err != nil && !lost {
			errs = append(errs, fmt.Errorf("restoring %s: %w", r.Repo, err))
			continue
		}
		if err := cluster.Restored(ctx, rt.Node.DB, r.Repo, rt.Node.Name, lost); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// trashLost tells whether a restore's copy is gone from this node's
// trash (and not already back under its name).
func (rt *Router) trashLost(r cluster.PendingRestore) bool {
	if _, err := rt.Repos.Resolve(r.Repo); err == nil {
		return false
	}
	list, err := rt.Repos.ListTrash()
	if err != nil {
		return false
	}
	for _, t := range list {
		if t.Name == r.Repo && t.Stamp() == r.Stamp {
			return false
		}
	}
	return true
}

// hasCopy tells whether this node's copy of name is on its disk, moving
// it there first if a rename or a restore in the cluster is still to.
func (rt *Router) hasCopy(ctx context.Context, name string) bool {
	if _, err := rt.Repos.Resolve(name); err == nil {
		return true
	}
	ctx = context.WithoutCancel(ctx)
	if errors.Join(rt.carryOutRenames(ctx), rt.carryOutRestores(ctx)) != nil {
		return false
	}
	_, err := rt.Repos.Resolve(name)
	return err == nil
}

// applySettings brings this node's copies up to their repositories'
// settings (HEAD's branch, the description, the quota, the mirroring:
// cluster.Settings).
func (rt *Router) applySettings(ctx context.Context) error {
	stale, err := cluster.StaleSettings(ctx, rt.Node.DB, rt.Node.Name)
	if err != nil {
		return err
	}
	var errs []error
	for name, st := range stale {
		r, err := rt.Repos.Resolve(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		if st.Head != "" && repo.Head(r) != st.Head {
			if err := repo.PointHead(ctx, r, st.Head); err != nil {
				errs = append(errs, fmt.Errorf("%s: setting HEAD: %w", name, err))
				continue
			}
		}
		if st.Description != nil && repo.Description(r) != *st.Description {
			if err := repo.SetDescription(r, *st.Description); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
		}
		if st.Quota != nil {
			if q, err := repo.Quota(r); err != nil || q != *st.Quota {
				if err := repo.SetQuota(ctx, r, *st.Quota); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", name, err))
					continue
				}
			}
		}
		if st.Mirror != nil {
			spec, err := mirror.ParseSpec(*st.Mirror)
			if err == nil {
				err = mirror.ApplySpec(ctx, r, spec)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: mirroring: %w", name, err))
				continue
			}
		}
		if err := cluster.SettingsApplied(ctx, rt.Node.DB, name, rt.Node.Name, st.Number); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
