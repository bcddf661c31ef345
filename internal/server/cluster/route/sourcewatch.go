package route

import (
	"context"
	"errors"
	"fmt"
	"time"

	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

// A catch-up reads from another copy (its refs' digest, then a fetch)
// with the copy's ref writes held (refwrites.go), so that no replication
// lands here meanwhile. A source that stops answering mid-read (its node
// paused, or cut off from this one) held the read, and with it every
// replication to this copy, until it came back: the new primary's pushes
// needed this copy's vote and waited too (bench/chaos pause-primary and
// partition: no push for the whole fault after the failover). git's own
// transfer has no deadline, and a whole-read timeout would cut a large
// copy's first fetch; so the read is given up on as a relay is
// (relaywatch.go): once the source's node is not answering this node's
// pings for a node timeout, or PostgreSQL records its heartbeat stale.

// errSourceLost: a catch-up's source stopped answering mid-read.
var errSourceLost = errors.New("the catch-up's source was given up on")

// sourceHealthEvery is how many relayCheck ticks pass between two reads
// of the source's heartbeat in PostgreSQL (its pings are checked each).
const sourceHealthEvery = 4

// watchSource returns a context for reading repo from node's copy that
// is cancelled, with an errSourceLost cause, when the node stops
// answering (see above); stop ends the watch.
func (rt *Router) watchSource(ctx context.Context, repo, node string) (wctx context.Context, stop func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	check := rt.sourceCheck
	if check == nil {
		check = rt.sourceAnswers
	}
	go func() {
		t := time.NewTicker(relayCheck)
		defer t.Stop()
		for tick := 1; ; tick++ {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			if err := check(wctx, repo, node, tick%sourceHealthEvery == 0); err != nil {
				cancel(fmt.Errorf("%w: %v", errSourceLost, err))
				return
			}
		}
	}()
	return wctx, func() { cancel(nil) }
}

// sourceAnswers is nil while node may still be serving: this node's
// pings reach it, and (health) PostgreSQL records its heartbeat fresh. A
// placement that cannot be read gives nothing up: the node may well be
// serving.
func (rt *Router) sourceAnswers(ctx context.Context, repo, node string, health bool) error {
	if rt.Node.Unreached(node) {
		return fmt.Errorf("node %s has not answered this node's pings for %v", node, rt.Node.NodeTimeout())
	}
	if !health {
		return nil
	}
	lctx, cancel := store.RequestContext(ctx)
	defer cancel()
	pl, err := cluster.Locate(lctx, rt.Node.DB, repo, rt.Node.NodeTimeout())
	if err != nil {
		return nil
	}
	if r, ok := pl.Replica(node); !ok || !r.Healthy {
		return fmt.Errorf("node %s stopped answering the cluster", node)
	}
	return nil
}

// sourceErr is err, a read from a source under watchSource's wctx, with
// the reason the source was given up on if it was.
func sourceErr(wctx context.Context, err error) error {
	if cause := context.Cause(wctx); err != nil && errors.Is(cause, errSourceLost) {
		return fmt.Errorf("%w (%v)", cause, err)
	}
	return err
}
