package route

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

// relayCheck is how often a relay whose serving node has sent nothing
// for as long reads the repository's placement again: a node paused,
// cut off or demoted is given up on within a heartbeat of PostgreSQL
// recording it, not when the client's own patience ends.
const relayCheck = 250 * time.Millisecond

// errServingLost: the node a relay waits for is no longer the one to
// serve it (not the primary any more, or its heartbeat stale). Before
// its answer nothing of the client's request was sent, so the request
// is routed again (Route); after, it is refused, retryably.
var errServingLost = errors.New("the serving node was given up on")

// relayWatch cuts a relay whose serving node the cluster no longer
// trusts with it, as PostgreSQL records it.
type relayWatch struct {
	rt    *Router
	repo  string
	to    string
	write bool
	quiet func() time.Duration // since the serving node last sent something
	cause atomic.Pointer[error]
}

// watch checks, every relayCheck while the serving node is quiet, until
// ctx ends, and calls lost once, with the cause, when:
//   - a push's repository has another primary (a failover, or the old
//     primary stepped down);
//   - the serving node's heartbeat is stale in PostgreSQL (paused,
//     killed, cut off from it), or this node's pings have not reached it
//     for a node timeout (cut off from this node, or paused).
//
// Before the serving node answered, Route then routes the request again
// (and a push waits there for the failover); after, it is refused. A
// placement it cannot read (PostgreSQL not answering this node) cuts
// nothing on its own: the node may well be serving.
func (w *relayWatch) watch(ctx context.Context, lost func()) {
	if w.rt.Node == nil {
		// A router outside a cluster node (the relay's own tests): no
		// heartbeats or pings to watch. Before, a relay quiet for a check
		// under load read the nil node and crashed the test binary.
		return
	}
	t := time.NewTicker(relayCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if w.quiet() < relayCheck {
			continue
		}
		var why error
		if w.rt.Node.Unreached(w.to) {
			why = fmt.Errorf("%w: node %s has not answered this node's pings for %v", errServingLost, w.to, w.rt.Node.NodeTimeout())
		} else {
			lctx, cancel := store.RequestContext(ctx)
			pl, err := cluster.Locate(lctx, w.rt.Node.DB, w.repo, w.rt.Node.NodeTimeout())
			cancel()
			if err != nil {
				continue
			}
			r, ok := pl.Replica(w.to)
			switch {
			case w.write && pl.Primary != w.to:
				why = fmt.Errorf("%w: node %s is no longer the primary of '%s' (node %s is)", errServingLost, w.to, w.repo, pl.Primary)
			case !ok || !r.Healthy:
				why = fmt.Errorf("%w: node %s stopped answering the cluster", errServingLost, w.to)
			}
		}
		if why != nil {
			w.cause.Store(&why)
			lost()
			return
		}
	}
}

// lost is why the relay was cut, nil if it was not.
func (w *relayWatch) lost() error {
	if p := w.cause.Load(); p != nil {
		return *p
	}
	return nil
}
