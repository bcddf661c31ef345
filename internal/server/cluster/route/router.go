// Package route is the pipeline's view of the cluster on one node (see
// package cluster): which requests this node serves, what a push on the
// primary needs, and keeping this node's copies current.
package route

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"packwire/internal/gitexec"
	"packwire/internal/pipeline"
	"packwire/internal/push"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

// Router is the pipeline's view of the cluster on one node: which
// requests this node serves, and what a push on the primary needs. It
// also keeps this node's copies current (Reconcile).
type Router struct {
	Node     *cluster.Node
	Secret   string    // the cluster user's password
	HooksDir string    // core.hooksPath of pushes on the primary: proc-receive and reference-transaction
	Repos    repo.Root // this node's repositories
	// CatchUpWait bounds how long a read waits for this node's stale copy
	// to catch up before it is refused.
	CatchUpWait time.Duration

	mu       sync.Mutex
	catching map[string]chan struct{} // repositories being caught up, closed when done
	moving   sync.Mutex               // one carryOut of deletions, renames or restores at a time

	// The hooks' socket (ServeHooks) and what is between a push's calls.
	hookSocket, hookToken string
	pending               map[string]pendingPush   // repo NUL receive-pack pid
	pushes                map[string]*livePush     // pushes with a hooks directory of their own, by id
	recording             map[string]chan struct{} // repo -> the record of the primary's copy in progress
	spareDirs             []string                 // pushes' hooks directories made ahead (pushdir.go)
	afterCommit           func(repo string)        // SetAfterCommit
	dieBeforeCommit       func(repo string) bool   // SetDieBeforeCommit
	unackedSeen           map[string]string        // git dir -> a kept replication found not to concern its generation (undo.go)
	onCatchUp             func(repo, at string)    // SetCatchUpHook
	// sourceCheck replaces sourceAnswers in tests (nil: sourceAnswers).
	sourceCheck func(ctx context.Context, repo, node string, health bool) error
}

// SetCatchUpHook sets a function run at points of this node's catch-ups
// of a copy: "bring" before it chooses a source and fetches, "end" when
// the catch-up returns. Tests hold a catch-up there (nil: none).
func (rt *Router) SetCatchUpHook(f func(repo, at string)) {
	rt.mu.Lock()
	rt.onCatchUp = f
	rt.mu.Unlock()
}

func (rt *Router) catchUpHook(repo, at string) {
	rt.mu.Lock()
	f := rt.onCatchUp
	rt.mu.Unlock()
	if f != nil {
		f(repo, at)
	}
}

// SetAfterCommit sets a function run once a push's generation is
// committed in PostgreSQL, before the hook lets git write the primary's
// refs: tests widen that window with it (nil: none).
func (rt *Router) SetAfterCommit(f func(repo string)) {
	rt.mu.Lock()
	rt.afterCommit = f
	rt.mu.Unlock()
}

// SetDieBeforeCommit sets a function asked once a push has its majority,
// before its generation is committed: when it says so, the push ends
// there as if this node had died (every replica's answer is waited for,
// nothing is committed, no replica is set back). Tests make the copies a
// dead primary leaves with it (nil: none).
func (rt *Router) SetDieBeforeCommit(f func(repo string) bool) {
	rt.mu.Lock()
	rt.dieBeforeCommit = f
	rt.mu.Unlock()
}

// Route serves here what this node can: reads from an up-to-date copy,
// pushes when it is the repository's primary (receive-pack gets the hook
// that replicates before git commits). Otherwise it relays: pushes to the
// primary, reads to a healthy up-to-date replica (a stale copy here is
// caught up meanwhile). A request another node relayed is served here or
// refused, never relayed again; another node's own requests (replication,
// catch-up) are served from what is here.
//
// A relay whose serving node the cluster gives up on before it answers
// (relayWatch), or a push that finds its primary's heartbeat stale, is
// routed again, from a fresh placement: to the new primary once the
// failover is recorded.
func (rt *Router) Route(ctx context.Context, r repo.Repo, write bool, req pipeline.Request) (pipeline.Route, error) {
	for routes := 1; ; routes++ {
		route, err := rt.route(ctx, r, write, req)
		if routes == maxRoutes || !errors.Is(err, errServingLost) || ctx.Err() != nil {
			return route, err
		}
		rt.Node.Log.Info("cluster: request routed again", "repo", r.Name, "service", req.Service, "why", errors.Unwrap(err))
	}
}

// maxRoutes bounds how many times one request is routed (Route).
const maxRoutes = 3

func (rt *Router) route(ctx context.Context, r repo.Repo, write bool, req pipeline.Request) (pipeline.Route, error) {
	name := r.Name
	if req.Principal.IsCluster() {
		return pipeline.Route{}, nil
	}
	pl, err := rt.locate(ctx, name, req)
	if errors.Is(err, cluster.ErrNotPlaced) {
		// Deleted from the cluster or renamed, its copy here not yet moved.
		lctx, cancel := store.RequestContext(ctx)
		leaving, err := cluster.MovingAway(lctx, rt.Node.DB, name, rt.Node.Name)
		cancel()
		if err != nil {
			return pipeline.Route{}, pipeline.StoreUnavailable(err)
		}
		notFound := &pipeline.Error{Code: pipeline.CodeNotFound, Message: fmt.Sprintf("repository '%s' not found", name)}
		if leaving {
			go func() {
				ctx := context.WithoutCancel(ctx)
				rt.carryOutRenames(ctx) // first: a copy renamed, then deleted, goes to the trash
				rt.carryOutDeletions(ctx)
			}()
			return pipeline.Route{}, notFound
		}
		// A deletion carried out since the pipeline found the copy here
		// has moved it away before clearing its row: look again.
		if _, err := rt.Repos.Resolve(name); errors.Is(err, repo.ErrNotFound) {
			return pipeline.Route{}, notFound
		}
		// On this node's disk only (made before the node joined), or
		// nowhere: served as a single server would.
		return pipeline.Route{}, nil
	}
	if err != nil {
		return pipeline.Route{}, pipeline.StoreUnavailable(err)
	}
	me := rt.Node.Name
	// A copy renamed in the cluster is moved here before it is served.
	upToDate := pl.UpToDate(me)
	if pl.Has(me) && r.Path == "" && !rt.hasCopy(ctx, name) {
		upToDate = false
	}
	if write {
		if pl.Primary == me {
			if !upToDate && !pl.Committing(me, rt.Node.NodeTimeout()) {
				// This copy is new (not made yet) or behind: the hook would
				// refuse. Catch up first, as a read does.
				if err := rt.catchUpFor(ctx, name); err != nil {
					return pipeline.Route{}, err
				}
			}
			rt.mu.Lock()
			socket, token := rt.hookSocket, rt.hookToken
			rt.mu.Unlock()
			if socket == "" {
				return pipeline.Route{}, &pipeline.Error{Code: pipeline.CodeUnavailable, RetryAfter: 2 * time.Second,
					Message: "this node is starting, retry shortly", Err: errors.New("cluster: the hooks' socket is not listening")}
			}
			return pipeline.Route{
				HeadMoved: func(ctx context.Context, branch string) error {
					_, err := cluster.SetSettings(context.WithoutCancel(ctx), rt.Node.DB, name, cluster.Change{Head: branch})
					return err
				},
				// Every push's objects kept as the pack the client sent (its
				// bases appended): the replicas get that pack as it is
				// (keptPack) instead of one made again. Not flushed to disk
				// (git flushes packs, not the loose objects a small push
				// makes on one server, nor refs): an acknowledged push is
				// kept by its copies on a majority of nodes, whose packs are
				// not flushed either, and a flush here cost milliseconds per
				// push, and stalls on a busy disk.
				Config: []string{"core.hooksPath=" + rt.HooksDir, "receive.unpackLimit=1", "core.fsync=-pack,-pack-metadata"},
				Env:    rt.hookEnv(name, socket, token),
				// A hooks directory of the push's own, when git commits it in
				// one transaction: the hook runs once, not twice (pushdir.go).
				Push: func(kept []push.Command, guarded bool) ([]string, []string, func()) {
					return rt.startPush(name, kept, guarded)
				},
			}, nil
		}
		primary, ok := pl.Replica(pl.Primary)
		if req.Relayed || !ok || !primary.Healthy {
			noPrimary := &pipeline.Error{Code: pipeline.CodeUnavailable, RetryAfter: 2 * time.Second,
				Message: fmt.Sprintf("'%s' has no reachable primary right now (node %s), retry shortly", name, pl.Primary)}
			if ok && !req.Relayed && rt.awaitFailover(ctx, name, pl.Primary) {
				noPrimary.Err = fmt.Errorf("%w: node %s failed over", errServingLost, pl.Primary)
			}
			return pipeline.Route{}, noPrimary
		}
		if rt.Node.Unreached(primary.Node) {
			// Healthy in PostgreSQL but not answering this node: paused (its
			// failover follows), or the network between them cut. Refused
			// at once if this node reaches none of the other copies (it is
			// the one cut off: the client should try another node).
			unreachable := &pipeline.Error{Code: pipeline.CodeUnavailable, RetryAfter: 2 * time.Second,
				Message: fmt.Sprintf("'%s''s primary (node %s) is unreachable from this node right now, retry shortly", name, pl.Primary)}
			if !rt.cutOff(pl) && rt.awaitFailover(ctx, name, pl.Primary) {
				unreachable.Err = fmt.Errorf("%w: node %s failed over or answers again", errServingLost, pl.Primary)
			}
			return pipeline.Route{}, unreachable
		}
		relay, err := rt.relayTo(ctx, primary, req, name, pl)
		return pipeline.Route{Relay: relay}, err
	}
	if upToDate {
		return pipeline.Route{}, nil
	}
	if !req.Relayed {
		if to, ok := upToDatePeer(pl, me, rt.Node.Unreached); ok {
			if pl.Has(me) {
				go rt.catchUp(context.WithoutCancel(ctx), name) // for the next read
			}
			relay, err := rt.relayTo(ctx, to, req, name, pl)
			return pipeline.Route{Relay: relay}, err
		}
	}
	if !pl.Has(me) {
		return pipeline.Route{}, &pipeline.Error{Code: pipeline.CodeUnavailable, RetryAfter: 2 * time.Second,
			Message: fmt.Sprintf("'%s' has no up-to-date copy on a healthy node right now, retry shortly", name)}
	}
	// Relayed here, or nowhere better: catch up, then serve.
	if err := rt.catchUpFor(ctx, name); err != nil {
		return pipeline.Route{}, err
	}
	return pipeline.Route{}, nil
}

// awaitFailover waits, up to the node timeout, for PostgreSQL to record
// another primary of name than old, whose heartbeat is stale or which
// does not answer this node's pings: it tells whether it did (or old
// answers again), so that a push that came in the seconds between the
// two goes to the new primary instead of failing.
func (rt *Router) awaitFailover(ctx context.Context, name, old string) bool {
	deadline := time.Now().Add(rt.Node.NodeTimeout())
	t := time.NewTicker(relayCheck)
	defer t.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		lctx, cancel := store.RequestContext(ctx)
		pl, err := cluster.Locate(lctx, rt.Node.DB, name, rt.Node.NodeTimeout())
		cancel()
		if err != nil {
			return false
		}
		if p, ok := pl.Replica(pl.Primary); pl.Primary != old || ok && p.Healthy && !rt.Node.Unreached(old) {
			return true
		}
	}
	return false
}

// cutOff tells whether this node's pings reach none of the repository's
// other copies' nodes (a partition that isolates this node).
func (rt *Router) cutOff(pl cluster.Placement) bool {
	others := 0
	for _, r := range pl.Replicas {
		if r.Node == rt.Node.Name {
			continue
		}
		if !rt.Node.Unreached(r.Node) {
			return false
		}
		others++
	}
	return others > 0
}

// locate reads the repository's placement for a request. A request
// another node relayed here comes with the placement that node routed it
// by, read moments before: it is used as it is (a round trip to
// PostgreSQL less on the relay's path). It is as current as a read here
// would be, since neither holds anything: a push still checks, with the
// repository's row locked, that this node is its primary (BeginPush),
// and commits only in the epoch it read there.
func (rt *Router) locate(ctx context.Context, name string, req pipeline.Request) (cluster.Placement, error) {
	if req.Relayed {
		if pl, ok := carried(ctx, name); ok {
			return pl, nil
		}
	}
	// The store is asked with a deadline: a PostgreSQL that does not answer
	// (restarting, cut off) refuses the request instead of holding it.
	lctx, cancel := store.RequestContext(ctx)
	defer cancel()
	return cluster.Locate(lctx, rt.Node.DB, name, rt.Node.NodeTimeout())
}

// catchUpFor catches this node's copy up for a request, within
// CatchUpWait; a refusal the client can retry otherwise.
func (rt *Router) catchUpFor(ctx context.Context, name string) error {
	wait := rt.CatchUpWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	cctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := rt.catchUp(cctx, name); err != nil {
		return &pipeline.Error{Code: pipeline.CodeUnavailable, RetryAfter: 5 * time.Second,
			Message: fmt.Sprintf("'%s' is not up to date on this node yet, retry shortly", name), Err: err}
	}
	return nil
}

// upToDatePeer picks a healthy replica at the repository's generation,
// the primary first.
// Nodes unreached skips (this node's pings do not reach them).
func upToDatePeer(pl cluster.Placement, me string, unreached func(node string) bool) (cluster.Replica, bool) {
	if p, ok := pl.Replica(pl.Primary); ok && p.Node != me && p.Healthy && p.Generation == pl.Generation && !unreached(p.Node) {
		return p, true
	}
	for _, r := range pl.Replicas {
		if r.Node != me && r.Healthy && r.Generation == pl.Generation && !unreached(r.Node) {
			return r, true
		}
	}
	return cluster.Replica{}, false
}

// clientURL names a node for a refusal's message.
func (rt *Router) clientURL(pl cluster.Placement, node string) string {
	for _, r := range pl.Replicas {
		if r.Node == node {
			return r.URL
		}
	}
	return node
}

// Reconcile brings every copy this node should hold up to its
// repository's generation: creates the ones placed here (empty, or
// fetched from the primary) and catches up stale ones. Run by the
// node's loop and before a read of a stale copy.
func (rt *Router) Reconcile(ctx context.Context) error {
	// Renames first: a copy renamed, then deleted, is moved to its new
	// name and then into the trash (carryOutDeletions waits for it).
	deletions := errors.Join(rt.carryOutRenames(ctx), rt.carryOutDeletions(ctx), rt.carryOutRestores(ctx), rt.carryOutDrops(ctx))
	rows, err := rt.Node.DB.QueryContext(ctx, `SELECT rp.repo FROM replicas rp JOIN cluster_repos c ON c.name = rp.repo
		WHERE rp.node = ? AND rp.generation <> c.generation ORDER BY rp.repo`, rt.Node.Name)
	if err != nil {
		return err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return err
		}
		names = append(names, n)
	}
	rows.Close()
	errs := []error{deletions, rt.undoStranded(ctx)}
	for _, n := range names {
		if err := rt.catchUp(ctx, n); err != nil && ctx.Err() == nil && !errors.Is(err, errWaiting) {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
		}
	}
	errs = append(errs, rt.applySettings(ctx))
	return errors.Join(errs...)
}

// errWaiting: the copy cannot catch up before another node acts (the
// primary's import); not worth a warning.
var errWaiting = errors.New("waiting for the primary's import")

// catchUp brings this node's copy of name to the repository's generation,
// one catch-up per repository at a time (others wait for it).
func (rt *Router) catchUp(ctx context.Context, name string) error {
	rt.mu.Lock()
	if rt.catching == nil {
		rt.catching = map[string]chan struct{}{}
	}
	if ch, ok := rt.catching[name]; ok {
		rt.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		pl, err := cluster.Locate(ctx, rt.Node.DB, name, rt.Node.NodeTimeout())
		if err != nil {
			return err
		}
		if !pl.UpToDate(rt.Node.Name) && !pl.Committing(rt.Node.Name, rt.Node.NodeTimeout()) {
			return errors.New("still behind after a catch-up")
		}
		return nil
	}
	ch := make(chan struct{})
	rt.catching[name] = ch
	rt.mu.Unlock()
	defer func() {
		rt.mu.Lock()
		delete(rt.catching, name)
		rt.mu.Unlock()
		close(ch)
		rt.catchUpHook(name, "end")
	}()
	for round := 0; round < catchUpRounds; round++ {
		done, err := rt.catchUpRound(ctx, name)
		if errors.Is(err, errNoSource) {
			// The copies at the generation moved on before they were read
			// (pushes go on), or none holds it: the held round tells.
			continue
		}
		if err != nil || done {
			return err
		}
	}
	// Pushes kept moving the generation while this copy fetched: one more
	// round with the repository's pushes held, bounded (MaxHold).
	ok, err := cluster.HoldPushes(ctx, rt.Node.DB, name, rt.Node.Name, cluster.MaxHold, rt.Node.NodeTimeout(),
		func(ctx context.Context, pl cluster.Placement) (string, error) {
			if pl.UpToDate(rt.Node.Name) {
				return rt.copyDigest(name)
			}
			if pl.Committing(rt.Node.Name, rt.Node.NodeTimeout()) {
				return "", errLanding // its record follows git's write
			}
			if pl.Source != "" && pl.Generation == 0 {
				return "", errWaiting
			}
			// Made by a round before.
			r, err := rt.Repos.Resolve(name)
			if err != nil {
				return "", err
			}
			return rt.bringTo(ctx, r, pl, true)
		})
	if errors.Is(err, errLanding) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("catching up with the repository's pushes held: %w", err)
	}
	if !ok {
		return errors.New("not recorded at the generation after a catch-up with its pushes held")
	}
	return nil
}

// catchUpRounds is how many catch-up rounds run while pushes go on
// before the last one holds them (cluster.HoldPushes).
const catchUpRounds = 2

// catchUpRound is one round of catchUp without holding pushes: it tells
// whether this copy is now recorded at the repository's generation (or
// needs nothing: current, or its own push landing).
func (rt *Router) catchUpRound(ctx context.Context, name string) (bool, error) {
	pl, err := cluster.Locate(ctx, rt.Node.DB, name, rt.Node.NodeTimeout())
	if err != nil {
		return false, err
	}
	if pl.UpToDate(rt.Node.Name) || pl.Committing(rt.Node.Name, rt.Node.NodeTimeout()) {
		// Current, or this primary's own push is landing: fetching now
		// would race git writing the same refs.
		return true, nil
	}
	if pl.Primary == rt.Node.Name && pl.Source != "" && pl.Generation == 0 {
		// A repository imported into the cluster: the primary imports it,
		// as its first generation; the other copies catch up from it.
		if err := rt.importSource(ctx, name, pl.Source); err != nil && !errors.Is(err, repo.ErrExists) {
			return false, fmt.Errorf("importing from %s: %w", pl.Source, err)
		}
		digest, err := rt.copyDigest(name)
		if err != nil {
			return false, err
		}
		return false, cluster.Imported(ctx, rt.Node.DB, name, rt.Node.Name, digest)
	}
	if pl.Source != "" && pl.Generation == 0 {
		return false, errWaiting
	}
	r, err := rt.ensureLocal(ctx, name)
	if err != nil {
		return false, err
	}
	digest, err := rt.bringTo(ctx, r, pl, false)
	if err != nil {
		return false, err
	}
	if pl.Digest != "" && digest != pl.Digest {
		// The copy it fetched from moved on meanwhile (a push between its
		// replication and its commit): not recorded; again.
		return false, nil
	}
	// Recorded only if no push committed meanwhile; otherwise again.
	return cluster.SetReplicaGeneration(ctx, rt.Node.DB, name, rt.Node.Name, pl.Generation, digest)
}

// bringTo makes the copy r's refs the generation's of pl and returns
// their digest, read once written. Generation 0 has no refs; any other
// is fetched from a copy proven to hold it: healthy, recorded at the
// generation, and serving refs with the generation's digest (the
// primary first). A copy recorded at the generation but whose refs are
// not its, or a primary whose push is still landing, is never fetched
// from: a pruning fetch from it would delete what it lacks here.
func (rt *Router) bringTo(ctx context.Context, r repo.Repo, pl cluster.Placement, held bool) (string, error) {
	rt.catchUpHook(pl.Repo, "bring")
	// No replication writes here meanwhile (refwrites.go); and a copy
	// recorded at the generation since pl was read (a late record of a
	// push it took) may already hold a newer push, which the pruning
	// fetch below would delete: it is left as it is.
	writes, err := lockRefWrites(ctx, r.Path)
	if err != nil {
		return "", err
	}
	defer writes.Release()
	now, err := cluster.Locate(ctx, rt.Node.DB, pl.Repo, rt.Node.NodeTimeout())
	if err != nil {
		return "", err
	}
	if now.UpToDate(rt.Node.Name) {
		return cluster.CopyDigest(r.Path)
	}
	if pl.Generation == 0 {
		// No push was ever committed: the repository has no refs, and a
		// copy that has some (a push that failed after this copy took
		// it, then marked stale) drops them.
		if err := dropRefs(ctx, r.Path); err != nil {
			return "", err
		}
		return cluster.CopyDigest(r.Path)
	}
	if pl.Digest != "" {
		// Its refs are the generation's already (a set-back of a failed
		// push, say): nothing to fetch.
		if digest, err := cluster.CopyDigest(r.Path); err == nil && digest == pl.Digest {
			return digest, nil
		}
	}
	from, err := rt.catchUpSource(ctx, pl)
	if errors.Is(err, errNoSource) && held {
		// No copy holds the generation: this one may, but for a
		// replication its primary never committed (undo.go); with the
		// turn held, it never will be.
		digest, uerr := undoLastReplication(ctx, r.Path, pl.Digest)
		if uerr == nil {
			rt.Node.Log.Info("cluster: undid a replication its primary never committed", "repo", pl.Repo, "generation", pl.Generation)
			return digest, nil
		}
		if !errors.Is(uerr, errNothingToUndo) {
			err = fmt.Errorf("%w; undoing this copy's last replication: %v", err, uerr)
		}
	}
	if err != nil {
		return "", err
	}
	return rt.fetchFrom(ctx, r, pl, from)
}

// fetchFrom makes r's refs from's (bringTo) and returns their digest.
func (rt *Router) fetchFrom(ctx context.Context, r repo.Repo, pl cluster.Placement, from cluster.Replica) (string, error) {
	// Every ref as it is there, refs it no longer has deleted, in one
	// transaction (--atomic).
	// No automatic gc after the fetch: maintenance owns the object
	// layout (a detached gc would repack under other readers).
	fctx, stop := rt.watchSource(ctx, pl.Repo, from.Node)
	defer stop()
	cmd := exec.CommandContext(fctx, "git", "-c", "gc.auto=0", "-c", "maintenance.auto=false", "--git-dir", r.Path, "fetch", "--quiet", "--prune", "--atomic", "--no-write-fetch-head",
		cluster.RepoURL(from.URL, pl.Repo), "+refs/*:refs/*", "^"+cluster.LocalRefs+"*")
	cmd.Env = append(os.Environ(), cluster.AuthEnv(rt.Secret)...)
	gitexec.StopGently(cmd, 5*time.Second) // stopped, it leaves no ref locks
	out, err := cmd.CombinedOutput()
	if err != nil && strings.Contains(string(out), ".lock': File exists") {
		// A ref lock left by a git killed before it could remove it. No
		// replication writes here now (refWritesLock), and no git holds
		// a ref lock for longer than a push's lease: one older is stale.
		if n, rerr := repo.RemoveStaleLocks(r, time.Now().Add(-cluster.PushLease)); rerr == nil && n > 0 {
			rt.Node.Log.Info("cluster: removed ref locks left by a killed git", "repo", pl.Repo, "locks", n)
			return rt.fetchFrom(ctx, r, pl, from)
		}
	}
	if err != nil {
		return "", fmt.Errorf("fetching from %s: %w: %s", from.Node, sourceErr(fctx, err), cluster.LastLines(string(out), 3))
	}
	// The refs are another copy's now: the last replication kept here no
	// longer describes them (undo.go).
	os.Remove(filepath.Join(r.Path, undoFile))
	return cluster.CopyDigest(r.Path)
}

// catchUpSource picks the copy to fetch pl's generation from: another
// healthy copy recorded at the generation whose refs, read now, have the
// generation's digest (any, when it is not known), the primary first.
func (rt *Router) catchUpSource(ctx context.Context, pl cluster.Placement) (cluster.Replica, error) {
	var candidates []cluster.Replica
	if p, ok := pl.Replica(pl.Primary); ok {
		candidates = append(candidates, p)
	}
	for _, r := range pl.Replicas {
		if r.Node != pl.Primary {
			candidates = append(candidates, r)
		}
	}
	var why []string
	for _, c := range candidates {
		if c.Node == rt.Node.Name || !c.Healthy || c.Generation != pl.Generation {
			continue
		}
		if pl.Digest == "" {
			return c, nil
		}
		rctx, stop := rt.watchSource(ctx, pl.Repo, c.Node)
		digest, _, err := cluster.RemoteDigest(rctx, cluster.RepoURL(c.URL, pl.Repo), rt.Secret)
		err = sourceErr(rctx, err)
		stop()
		switch {
		case err != nil:
			why = append(why, c.Node+": "+err.Error())
		case digest != pl.Digest:
			why = append(why, c.Node+": its refs are not the generation's")
		default:
			return c, nil
		}
	}
	if len(why) == 0 {
		why = append(why, "none is healthy and at it")
	}
	return cluster.Replica{}, fmt.Errorf("%w %d to catch up from (%s)", errNoSource, pl.Generation, strings.Join(why, "; "))
}

// errLanding: this primary's own push is between its commit and git's
// write: not a copy to fetch into.
var errLanding = errors.New("this primary's push is landing")

// errNoSource: no copy is proven to hold the generation a catch-up read.
var errNoSource = errors.New("no copy proven to hold generation")

// dropRefs deletes every ref of a copy but this node's own (LocalRefs),
// in one transaction.
func dropRefs(ctx context.Context, gitDir string) error {
	out, err := exec.CommandContext(ctx, "git", "--git-dir", gitDir, "for-each-ref", "--format=delete %(refname) %(objectname)").Output()
	if err != nil {
		return fmt.Errorf("listing refs: %w", err)
	}
	var in strings.Builder
	for _, line := range strings.Split(string(out), "\n") {
		if line != "" && !strings.HasPrefix(line, "delete "+cluster.LocalRefs) {
			in.WriteString(line + "\n")
		}
	}
	if in.Len() == 0 {
		return nil
	}
	cmd := exec.CommandContext(ctx, "git", "--git-dir", gitDir, "update-ref", "--stdin")
	gitexec.StopGently(cmd, 5*time.Second)
	cmd.Stdin = strings.NewReader(in.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("deleting refs: %v: %s", err, cluster.LastLines(string(out), 3))
	}
	return nil
}

// ensureLocal returns this node's copy, creating an empty one if missing
// (and no rename or restore is still to bring it here).
func (rt *Router) ensureLocal(ctx context.Context, name string) (repo.Repo, error) {
	if rt.hasCopy(ctx, name) {
		return rt.Repos.Resolve(name)
	}
	arriving, err := cluster.Arriving(ctx, rt.Node.DB, name, rt.Node.Name)
	if err != nil {
		return repo.Repo{}, err
	}
	if arriving {
		return repo.Repo{}, fmt.Errorf("waiting to move this node's copy to %s (a rename or a restore); retry shortly", name)
	}
	r, err := rt.Repos.Create(ctx, name)
	if errors.Is(err, repo.ErrExists) {
		return rt.Repos.Resolve(name)
	}
	return r, err
}

// InstallHooks makes dir the hooks directory of pushes on a primary:
// pushguard's proc-receive, a link to the packwire binary, and the
// reference-transaction hook, a link to hook (packwire-hook, or packwire
// itself); a push may need both.
func InstallHooks(dir, executable, hook string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Pushes' own directories (pushdir.go) left by a server that was
	// killed.
	if left, err := filepath.Glob(filepath.Join(dir, "push-*")); err == nil {
		for _, d := range left {
			os.RemoveAll(d)
		}
	}
	for name, executable := range map[string]string{cluster.HookName: hook, "proc-receive": executable} {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == executable {
			continue
		}
		tmp := link + ".tmp"
		os.Remove(tmp)
		if err := os.Symlink(executable, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, link); err != nil {
			return err
		}
	}
	return nil
}
