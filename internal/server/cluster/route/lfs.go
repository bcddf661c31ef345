package route

import (
	"context"
	"errors"
	"fmt"

	"packwire/internal/repo"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

// Placed answers for Git LFS (lfs.Cluster) whether the cluster places
// the repository name, and its quota (0: none): a node serves LFS for
// every repository of the cluster, whether it holds a copy or not. A
// repository deleted or renamed in the cluster whose copy here is not
// moved yet is not found, as Route answers git.
func (rt *Router) Placed(ctx context.Context, name string) (quota int64, placed bool, err error) {
	lctx, cancel := store.RequestContext(ctx)
	defer cancel()
	st, err := cluster.RepoSettings(lctx, rt.Node.DB, name)
	if errors.Is(err, cluster.ErrNotPlaced) {
		leaving, err := cluster.MovingAway(lctx, rt.Node.DB, name, rt.Node.Name)
		if err != nil {
			return 0, false, err
		}
		if leaving {
			return 0, false, fmt.Errorf("repository %s: %w", name, repo.ErrNotFound)
		}
		return 0, false, nil // on this node's disk only, or nowhere
	}
	if err != nil {
		return 0, false, err
	}
	if st.Quota != nil {
		quota = *st.Quota
	}
	return quota, true, nil
}

// Restorable answers for Git LFS (lfs.Cluster) whether repo restore can
// still bring back the deletion of name at stamp.
func (rt *Router) Restorable(ctx context.Context, name, stamp string) (bool, error) {
	return cluster.Restorable(ctx, rt.Node.DB, name, stamp)
}
