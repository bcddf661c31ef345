package route

import (
	"context"
	"errors"
	"fmt"
	"time"

	"packwire/internal/lifecycle"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
)

// carryOutDeletions moves this node's copies of repositories deleted from
// the cluster into its trash (as repo delete does on one server), then
// clears each deletion. A copy busy with a push, maintenance or a backup
// is left for the next run.
func (rt *Router) carryOutDeletions(ctx context.Context) error {
	rt.deleting.Lock()
	defer rt.deleting.Unlock()
	names, err := cluster.Deletions(ctx, rt.Node.DB, rt.Node.Name)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		_, err := lifecycle.Delete(rt.Repos, name, time.Now())
		if err != nil && !errors.Is(err, repo.ErrNotFound) {
			errs = append(errs, fmt.Errorf("deleting %s: %w", name, err))
			continue
		}
		if err := cluster.Deleted(ctx, rt.Node.DB, name, rt.Node.Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
