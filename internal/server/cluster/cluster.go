// Package cluster is where repositories live when several packwire nodes
// share one PostgreSQL store: nodes and their heartbeats, each
// repository's replicas, its primary and its generation, and the failover
// that promotes an up-to-date replica when a primary's node stops
// heartbeating. The server asks it where a repository lives; transports
// never learn about nodes. See docs/ARCHITECTURE.md, "The cluster".
//
// Every time here is PostgreSQL's (clock_timestamp()), so nodes' clocks are
// never compared with each other.
package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"packwire/internal/store"
)

// dbNowMS is PostgreSQL's clock in unix milliseconds.
const dbNowMS = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"

// Defaults.
const (
	DefaultHeartbeat   = time.Second
	DefaultNodeTimeout = 3 * time.Second
	DefaultReplicas    = 3
)

// SettingSecret is the store setting holding the password nodes use with
// each other (the cluster user's); the first node to start creates it.
const SettingSecret = "cluster-secret"

// ErrNotClustered is the answer of a cluster command on a SQLite store.
var ErrNotClustered = errors.New("not a cluster: the store is not in PostgreSQL (pass --database postgres://...)")

// Node is this process's membership: it registers, heartbeats and runs
// the failover monitor until its context ends.
type Node struct {
	DB *store.DB // the store's pool, which requests share
	// Membership, if set, is the pool of the heartbeat and the failover
	// monitor (Join, Run): a connection of their own (the server's holds
	// one), which requests never take, so that a node whose store pool is
	// full (pushes waiting for a repository's row lock) still heartbeats
	// rather than be failed over alive. nil: DB.
	Membership *store.DB
	Name       string
	URL        string // how other nodes reach this one (its internal HTTP base URL)
	Listeners  string // what clients reach: "git=...,http=...,ssh=..."
	Heartbeat  time.Duration
	Timeout    time.Duration // a node whose heartbeat is older is unhealthy
	Log        *slog.Logger
	// Reach, if set, asks the node at url whether it answers (bounded by
	// ctx): every heartbeat asks each other node, and reports those that
	// have not answered for Timeout (see peerReach), so that the monitor
	// moves the primaries of a node cut off from its replicas. nil: the
	// node reports nothing, and is taken to reach every other.
	Reach func(ctx context.Context, url string) error
	peers peerReach
	// OnTick, if set, runs after heartbeats (the node's catch-up of its
	// copies), in a goroutine of its own: once per heartbeat at most, and
	// never holding the next heartbeat up (a catch-up may fetch for long,
	// or wait for a connection of the store's pool).
	OnTick func(context.Context)
}

// membership is the pool of the heartbeat and the monitor.
func (n *Node) membership() *store.DB {
	if n.Membership != nil {
		return n.Membership
	}
	return n.DB
}

// Join registers the node (or updates its row after a restart) with a
// fresh heartbeat.
func (n *Node) Join(ctx context.Context) error {
	if n.DB.Engine != store.Postgres {
		return ErrNotClustered
	}
	if err := ValidName(n.Name); err != nil {
		return err
	}
	_, err := n.membership().ExecContext(ctx, `INSERT INTO nodes(name, url, listeners, started_ms, heartbeat_ms)
		VALUES(?, ?, ?, `+dbNowMS+`, `+dbNowMS+`)
		ON CONFLICT(name) DO UPDATE SET url = excluded.url, listeners = excluded.listeners,
			started_ms = excluded.started_ms, heartbeat_ms = excluded.heartbeat_ms, unreached = ''`, n.Name, n.URL, n.Listeners)
	if err != nil {
		return fmt.Errorf("cluster: registering node %s: %w", n.Name, err)
	}
	return nil
}

// ValidName: node names are short words (they appear in records and URLs).
func ValidName(name string) error {
	if name == "" || len(name) > 63 {
		return fmt.Errorf("node name %q: 1 to 63 characters", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("node name %q: letters, digits, '-', '_', '.' only", name)
		}
	}
	return nil
}

// Run heartbeats and runs the failover monitor every Heartbeat until ctx
// ends. A failed heartbeat is logged and retried: the node is marked
// unhealthy by the others if it stays failed for Timeout.
//
// The monitor judges others only once this node has been connected for a
// Timeout: when PostgreSQL was away (restarting) longer than that, every
// node's heartbeat is stale, and the first node back would otherwise
// promote replicas away from primaries that are alive and about to
// heartbeat again. A node really gone is still stale a Timeout later.
//
// Each step is bounded by the timeout: a heartbeat later than that is
// worth nothing, and a connection cut without a word (PostgreSQL
// restarted, a network gone) is dropped and replaced at the next one.
func (n *Node) Run(ctx context.Context) {
	t := time.NewTicker(n.heartbeat())
	defer t.Stop()
	var tick chan struct{}
	if n.OnTick != nil {
		tick = make(chan struct{}, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick:
					n.OnTick(ctx)
				}
			}
		}()
		defer func() { <-done }()
	}
	var connectedSince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		stepCtx, cancel := context.WithTimeout(ctx, n.NodeTimeout())
		err := n.beat(stepCtx, ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			n.Log.Warn("cluster: heartbeat failed", "node", n.Name, "error", err.Error())
			connectedSince = time.Time{}
			continue
		}
		if connectedSince.IsZero() {
			connectedSince = time.Now()
		}
		var promoted []Promotion
		if time.Since(connectedSince) >= n.NodeTimeout() {
			stepCtx, cancel := context.WithTimeout(ctx, n.NodeTimeout())
			promoted, err = Failover(stepCtx, n.membership(), n.NodeTimeout())
			cancel()
		}
		if err != nil && ctx.Err() == nil {
			n.Log.Warn("cluster: failover check failed", "node", n.Name, "error", err.Error())
		}
		for _, p := range promoted {
			why := "its node stopped heartbeating, or its copy stayed behind"
			if p.Cut {
				why = "it could not reach a majority of the copies"
			}
			n.Log.Info("cluster: primary promoted", "repo", p.Repo, "from", p.From, "to", p.To, "generation", p.Generation, "why", why)
		}
		select {
		case tick <- struct{}{}:
		default: // the last one is still running or pending: it will do
		}
	}
}

// beat writes the heartbeat with the peers this node has not reached,
// then lists the other nodes and asks them (in the background, bounded,
// within runCtx) whether they answer.
func (n *Node) beat(ctx, runCtx context.Context) error {
	unreached := ""
	if n.Reach != nil {
		unreached = n.peers.unreached(n.NodeTimeout())
	}
	res, err := n.membership().ExecContext(ctx, "UPDATE nodes SET heartbeat_ms = "+dbNowMS+", unreached = ? WHERE name = ?", unreached, n.Name)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 0 { // removed meanwhile: register again
		return n.Join(ctx)
	}
	if n.Reach == nil {
		return nil
	}
	rows, err := n.membership().QueryContext(ctx, "SELECT name, url FROM nodes WHERE name <> ?", n.Name)
	if err != nil {
		return err
	}
	defer rows.Close()
	var peers []peer
	for rows.Next() {
		var p peer
		if err := rows.Scan(&p.name, &p.url); err != nil {
			return err
		}
		peers = append(peers, p)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	n.peers.probe(runCtx, peers, n.NodeTimeout(), n.Reach)
	return nil
}

func (n *Node) heartbeat() time.Duration {
	if n.Heartbeat > 0 {
		return n.Heartbeat
	}
	return DefaultHeartbeat
}

// Unreached tells whether this node's pings have not reached peer for a
// node timeout (peerReach): the network between them is cut, or peer is
// paused, and a request relayed to it would wait. False when this node
// does not ping (Reach nil) or has not lately.
func (n *Node) Unreached(peer string) bool {
	return n.Reach != nil && n.peers.lost(peer, n.NodeTimeout())
}

// NodeTimeout is how old a heartbeat may be before its node is unhealthy.
func (n *Node) NodeTimeout() time.Duration {
	if n.Timeout > 0 {
		return n.Timeout
	}
	return DefaultNodeTimeout
}

// healthySQL is true for a node row (alias nd) heartbeating within the
// timeout, given as the query's next argument in milliseconds.
const healthySQL = "(" + dbNowMS + " - nd.heartbeat_ms <= ?)"

// behindFactor: a healthy primary's own copy is failed over from only
// once it has been behind for this many node timeouts. Its record after a
// push (RecordCopy) waits for a connection of the node's bounded pool, so
// under a storm it can lag a timeout behind the commit: promoting then
// moved primaries of nodes that were well (TestClusterTinyPool), while a
// primary restarted behind catches itself up meanwhile.
const behindFactor = 5

// Promotion is one failover: repo's primary moved from From to To.
type Promotion struct {
	Repo, From, To string
	Generation     int64
	Cut            bool // From was alive but could not reach a majority of the copies
}

// reachedCopies is the SQL count of the copies of the repository named
// by repo (an SQL expression) that the node of row nd reaches: its own,
// and those on nodes not in its unreached list.
func reachedCopies(nd, repo string) string {
	return "(SELECT count(*) FROM replicas c WHERE c.repo = " + repo + " AND (c.node = " + nd + ".name OR strpos(" + nd + ".unreached, ',' || c.node || ',') = 0))"
}

// majorityOf is the SQL majority of the copies of the repository named
// by repo, as a push needs it (PushTxn.Need).
func majorityOf(repo string) string {
	return "((SELECT count(*) FROM replicas c WHERE c.repo = " + repo + ") / 2 + 1)"
}

// Failover promotes, for every repository whose primary's node is
// unhealthy, or whose primary's own copy has been behind the repository's
// generation for longer than behindFactor timeouts (killed between a
// push's commit in PostgreSQL and in git, then restarted, and not caught
// up), or whose primary's node has not reached enough of the copies to
// make a majority for a node timeout (cut off from its replicas, it can
// acknowledge no push: see peerReach), a healthy replica at the
// repository's generation (the one on the node with the fewest primaries,
// then by name); for a primary whose node is alive (cut off, or its copy
// behind), only one whose node reaches a majority of the copies itself:
// one cut off too could take no push, and the repository would wait on
// it rather than on the old primary (issue 29: a copy behind was failed
// over to a node partitioned from the others). Each promotion is one conditional UPDATE on the primary
// and epoch it saw, so nodes running the monitor at once promote each
// repository once, and never make two primaries. A repository with no
// up-to-date healthy replica keeps its primary (writes wait for it rather
// than lose acknowledged pushes). A push in flight does not hold a
// failover up: it holds a lease (BeginPush), not the row, and its commit
// fails in the new epoch. A repository whose row is locked for a moment
// (a deletion, a move) is skipped until the next check rather than
// waited for: the monitor shares its connection with the heartbeat.
func Failover(ctx context.Context, db *store.DB, timeout time.Duration) ([]Promotion, error) {
	ms := timeout.Milliseconds()
	cut := "(nd.unreached <> '' AND " + reachedCopies("nd", "r.name") + " < " + majorityOf("r.name") + ")"
	rows, err := db.QueryContext(ctx, `SELECT r.name, r.primary_node, r.epoch, r.generation, `+healthySQL+` AND `+cut+`, `+healthySQL+` FROM cluster_repos r
		JOIN nodes nd ON nd.name = r.primary_node
		JOIN replicas own ON own.repo = r.name AND own.node = r.primary_node
		WHERE NOT `+healthySQL+` OR (own.generation <> r.generation AND `+dbNowMS+` - r.committed_ms > ?) OR `+cut, ms, ms, ms, behindFactor*ms)
	if err != nil {
		return nil, err
	}
	type orphan struct {
		name, primary string
		epoch, gen    int64
		cut           bool // alive, and cut off from a majority
		alive         bool // the primary's node heartbeats
	}
	var orphans []orphan
	for rows.Next() {
		var o orphan
		if err := rows.Scan(&o.name, &o.primary, &o.epoch, &o.gen, &o.cut, &o.alive); err != nil {
			rows.Close()
			return nil, err
		}
		orphans = append(orphans, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var done []Promotion
	for _, o := range orphans {
		var candidate string
		err := db.QueryRowContext(ctx, `SELECT rp.node FROM replicas rp JOIN nodes nd ON nd.name = rp.node
			WHERE rp.repo = ? AND rp.node <> ? AND rp.generation = ? AND `+healthySQL+`
			AND (? = 0 OR `+reachedCopies("nd", "rp.repo")+` >= `+majorityOf("rp.repo")+`)
			ORDER BY (SELECT count(*) FROM cluster_repos c WHERE c.primary_node = rp.node), rp.node LIMIT 1`,
			o.name, o.primary, o.gen, ms, o.alive).Scan(&candidate)
		if errors.Is(err, sql.ErrNoRows) {
			continue // nothing up to date to promote
		}
		if err != nil {
			return done, err
		}
		// The push turn goes too, lease or not: the old primary's push
		// cannot commit in the new epoch, and the new primary's take it
		// at once.
		res, err := db.ExecContext(ctx, `UPDATE cluster_repos SET primary_node = ?, epoch = epoch + 1, push_turn = push_turn + 1, push_holder = '', push_until_ms = 0
			WHERE name = (SELECT name FROM cluster_repos WHERE name = ? AND primary_node = ? AND epoch = ? FOR UPDATE SKIP LOCKED)`,
			candidate, o.name, o.primary, o.epoch)
		if err != nil {
			return done, err
		}
		if k, _ := res.RowsAffected(); k == 1 {
			done = append(done, Promotion{Repo: o.name, From: o.primary, To: candidate, Generation: o.gen, Cut: o.cut})
		}
	}
	return done, nil
}
