package cluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"packwire/internal/store"
)

// ErrNotPlaced: the repository has no row in the cluster.
var ErrNotPlaced = errors.New("not placed in the cluster")

// Placement is where one repository lives.
type Placement struct {
	Repo   string
	Source string // repo import: what the primary imports it from
	// CommitAge is how long ago the repository's generation was committed.
	CommitAge  time.Duration
	Primary    string
	Generation int64
	// Digest is the digest of the generation's refs (RefDigest); "": not
	// known (a row from before digests, a restore, a generation committed
	// by a node without digests), any copy's refs are taken as the
	// generation's until the next push writes one.
	Digest   string
	Epoch    int64
	Replicas []Replica
}

// Replica is one node's copy.
type Replica struct {
	Node       string `json:"node"`
	URL        string `json:"url"`
	Generation int64  `json:"generation"` // -1: not yet created on its node
	Healthy    bool   `json:"healthy"`
}

// Committing tells whether node, the primary, is behind only because a
// push it made is between its commit in PostgreSQL and in git (its
// hook's committed call comes within moments): not a copy to catch up.
func (p Placement) Committing(node string, timeout time.Duration) bool {
	r, ok := p.Replica(node)
	return ok && node == p.Primary && r.Generation >= 0 && r.Generation == p.Generation-1 && p.CommitAge <= timeout
}

// UpToDate tells whether node's replica holds the repository's generation.
func (p Placement) UpToDate(node string) bool {
	r, ok := p.Replica(node)
	return ok && r.Generation == p.Generation
}

// Replica returns node's replica, if it holds one.
func (p Placement) Replica(node string) (Replica, bool) {
	for _, r := range p.Replicas {
		if r.Node == node {
			return r, true
		}
	}
	return Replica{}, false
}

// Has tells whether node holds a replica.
func (p Placement) Has(node string) bool {
	_, ok := p.Replica(node)
	return ok
}

// Place records a new repository on n healthy nodes (all healthy ones if
// fewer), those with the fewest replicas first; the first is the primary.
// The nodes create it when they next reconcile (Node.Reconcile).
//
// source, if not empty, is what the primary imports the repository from
// (repo import); the other replicas then catch up from the primary.
func Place(ctx context.Context, db *store.DB, repo, source string, n int, timeout time.Duration) (Placement, error) {
	return PlaceMirror(ctx, db, repo, source, "", n, timeout)
}

// PlaceMirror is Place with the repository's mirroring set from the start
// (a mirror.Spec as JSON; "": none), so that the primary's import already
// knows the upstream's credentials and makes it read-only.
func PlaceMirror(ctx context.Context, db *store.DB, repo, source, mirror string, n int, timeout time.Duration) (Placement, error) {
	if db.Engine != store.Postgres {
		return Placement{}, ErrNotClustered
	}
	if n <= 0 {
		n = DefaultReplicas
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return Placement{}, err
	}
	defer tx.Rollback()
	if err := nameFree(ctx, tx, repo, ""); err != nil {
		return Placement{}, err
	}
	nodes, err := pickNodes(ctx, tx, n, timeout)
	if err != nil {
		return Placement{}, err
	}
	if len(nodes) == 0 {
		return Placement{}, errors.New("no healthy node to place it on (packwire cluster status)")
	}
	var mirrorArg any
	settings := 0
	if mirror != "" {
		mirrorArg, settings = mirror, 1
	}
	// Generation 0 of a new repository has no refs; an import's first
	// generation is the primary's (Imported).
	var digest, digestGen any = EmptyDigest, 0
	if source != "" {
		digest, digestGen = nil, nil
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO cluster_repos(name, primary_node, created_ms, committed_ms, source, mirror, settings, digest, digest_generation) VALUES(?, ?, "+dbNowMS+", "+dbNowMS+", ?, ?, ?, ?, ?)",
		repo, nodes[0], source, mirrorArg, settings, digest, digestGen)
	if store.IsUnique(err) {
		return Placement{}, fmt.Errorf("repository %s: %w", repo, store.ErrExists)
	}
	if err != nil {
		return Placement{}, err
	}
	p := Placement{Repo: repo, Primary: nodes[0]}
	for _, node := range nodes {
		if _, err := tx.ExecContext(ctx, "INSERT INTO replicas(repo, node) VALUES(?, ?)", repo, node); err != nil {
			return Placement{}, err
		}
		p.Replicas = append(p.Replicas, Replica{Node: node, Generation: -1})
	}
	return p, tx.Commit()
}

// placeOn picks a new repository's n healthy nodes, those with the fewest
// copies first (then by name), and puts first among them the one with
// the fewest primaries (then by name): with every repository on every
// node (three nodes, three copies), copy counts tie, and the primaries
// would otherwise all go to the first node by name.
func pickNodes(ctx context.Context, tx *store.Tx, n int, timeout time.Duration) ([]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT nd.name, (SELECT count(*) FROM cluster_repos c WHERE c.primary_node = nd.name) FROM nodes nd WHERE `+healthySQL+`
		ORDER BY (SELECT count(*) FROM replicas rp WHERE rp.node = nd.name), nd.name LIMIT ?`, timeout.Milliseconds(), n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var nodes []string
	var primaries []int64
	first := 0
	for rows.Next() {
		var name string
		var k int64
		if err := rows.Scan(&name, &k); err != nil {
			return nil, err
		}
		nodes, primaries = append(nodes, name), append(primaries, k)
		if last := len(nodes) - 1; k < primaries[first] || k == primaries[first] && name < nodes[first] {
			first = last
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(nodes) > 0 {
		nodes[0], nodes[first] = nodes[first], nodes[0]
	}
	return nodes, nil
}

// Locate reads a repository's placement, with each replica's node URL and
// health; ErrNotPlaced if the cluster does not know it.
func Locate(ctx context.Context, db *store.DB, repo string, timeout time.Duration) (Placement, error) {
	return locate(ctx, db, repo, timeout)
}

func locate(ctx context.Context, db querier, repo string, timeout time.Duration) (Placement, error) {
	p := Placement{Repo: repo}
	// One query, one round trip (every request asks): the repository's
	// row with its replicas, from one snapshot.
	rows, err := db.QueryContext(ctx, `SELECT c.primary_node, c.generation, `+knownDigest("c.")+`, c.epoch, c.source, `+dbNowMS+` - c.committed_ms,
		rp.node, nd.url, rp.generation, `+healthySQL+`
		FROM cluster_repos c LEFT JOIN (replicas rp JOIN nodes nd ON nd.name = rp.node) ON rp.repo = c.name
		WHERE c.name = ? ORDER BY rp.node`, timeout.Milliseconds(), repo)
	if err != nil {
		return p, err
	}
	defer rows.Close()
	found := false
	for rows.Next() {
		var ageMS int64
		var node, url sql.NullString
		var gen sql.NullInt64
		var healthy sql.NullBool
		if err := rows.Scan(&p.Primary, &p.Generation, &p.Digest, &p.Epoch, &p.Source, &ageMS, &node, &url, &gen, &healthy); err != nil {
			return p, err
		}
		found = true
		p.CommitAge = time.Duration(ageMS) * time.Millisecond
		if node.Valid {
			p.Replicas = append(p.Replicas, Replica{Node: node.String, URL: url.String, Generation: gen.Int64, Healthy: healthy.Bool})
		}
	}
	if err := rows.Err(); err != nil {
		return p, err
	}
	if !found {
		return p, fmt.Errorf("repository %s: %w", repo, ErrNotPlaced)
	}
	return p, nil
}

// SetReplicaGeneration records that node's copy of repo holds generation
// gen, only if the repository is still at gen (a push committed meanwhile
// leaves the copy behind, to be caught up again) and digest, the digest
// of the copy's refs read after its writes, is gen's (unless gen's is
// not known). It tells whether it was recorded.
func SetReplicaGeneration(ctx context.Context, db *store.DB, repo, node string, gen int64, digest string) (bool, error) {
	return setReplicaGeneration(ctx, db, repo, node, gen, digest)
}

// knownDigest is the SQL of a cluster_repos row's digest (columns named
// with prefix, its table's alias): ” unless it is of the row's
// generation (Placement.Digest).
func knownDigest(prefix string) string {
	return "COALESCE(CASE WHEN " + prefix + "digest_generation = " + prefix + "generation THEN " + prefix + "digest END, '')"
}

// execer runs a statement: a pool or a transaction.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func setReplicaGeneration(ctx context.Context, q execer, repo, node string, gen int64, digest string) (bool, error) {
	res, err := q.ExecContext(ctx, `UPDATE replicas SET generation = ? WHERE repo = ? AND node = ?
		AND EXISTS (SELECT 1 FROM cluster_repos WHERE name = ? AND generation = ? AND (`+knownDigest("")+` IN ('', ?)))`, gen, repo, node, repo, gen, digest)
	if err != nil {
		return false, err
	}
	k, _ := res.RowsAffected()
	return k == 1, nil
}

// Status is the cluster as `packwire cluster status --json` prints it.
type Status struct {
	Nodes []NodeStatus `json:"nodes"`
	Repos []RepoStatus `json:"repos"`
}

// NodeStatus is one node.
type NodeStatus struct {
	Name          string    `json:"name"`
	URL           string    `json:"url"`
	Listeners     string    `json:"listeners"`
	Healthy       bool      `json:"healthy"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	HeartbeatAge  string    `json:"heartbeat_age"`
	Started       time.Time `json:"started"`
	Primaries     int       `json:"primaries"`
	Replicas      int       `json:"replicas"`
}

// RepoStatus is one repository.
type RepoStatus struct {
	Name       string    `json:"name"`
	Primary    string    `json:"primary"`
	Generation int64     `json:"generation"`
	Digest     string    `json:"digest,omitempty"` // the generation's refs' (RefDigest); none: not known
	Epoch      int64     `json:"epoch"`
	Replicas   []Replica `json:"replicas"`
}

// ReadStatus reads every node and repository.
func ReadStatus(ctx context.Context, db *store.DB, timeout time.Duration) (Status, error) {
	if db.Engine != store.Postgres {
		return Status{}, ErrNotClustered
	}
	st := Status{Nodes: []NodeStatus{}, Repos: []RepoStatus{}}
	rows, err := db.QueryContext(ctx, `SELECT nd.name, nd.url, nd.listeners, nd.heartbeat_ms, nd.started_ms, `+dbNowMS+` - nd.heartbeat_ms, `+healthySQL+`,
		(SELECT count(*) FROM cluster_repos c WHERE c.primary_node = nd.name), (SELECT count(*) FROM replicas rp WHERE rp.node = nd.name)
		FROM nodes nd ORDER BY nd.name`, timeout.Milliseconds())
	if err != nil {
		return st, err
	}
	for rows.Next() {
		var n NodeStatus
		var beat, started, age int64
		if err := rows.Scan(&n.Name, &n.URL, &n.Listeners, &beat, &started, &age, &n.Healthy, &n.Primaries, &n.Replicas); err != nil {
			rows.Close()
			return st, err
		}
		n.LastHeartbeat, n.Started = time.UnixMilli(beat).UTC(), time.UnixMilli(started).UTC()
		n.HeartbeatAge = (time.Duration(age) * time.Millisecond).String()
		st.Nodes = append(st.Nodes, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, err
	}
	rows, err = db.QueryContext(ctx, "SELECT name FROM cluster_repos ORDER BY name")
	if err != nil {
		return st, err
	}
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return st, err
		}
		names = append(names, name)
	}
	rows.Close()
	for _, name := range names {
		p, err := Locate(ctx, db, name, timeout)
		if errors.Is(err, ErrNotPlaced) {
			continue // removed meanwhile
		}
		if err != nil {
			return st, err
		}
		if p.Replicas == nil {
			p.Replicas = []Replica{}
		}
		st.Repos = append(st.Repos, RepoStatus{Name: p.Repo, Primary: p.Primary, Generation: p.Generation, Digest: p.Digest, Epoch: p.Epoch, Replicas: p.Replicas})
	}
	return st, nil
}

// Imported records that the primary imported the repository (its first
// generation, whose refs have digest), if nothing happened to it
// meanwhile.
func Imported(ctx context.Context, db *store.DB, repo, node, digest string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, "UPDATE cluster_repos SET generation = 1, digest = ?, digest_generation = 1, committed_ms = "+dbNowMS+" WHERE name = ? AND primary_node = ? AND generation = 0", digest, repo, node)
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k != 1 {
		return errors.New("the repository changed during the import")
	}
	if _, err := tx.ExecContext(ctx, "UPDATE replicas SET generation = 1 WHERE repo = ? AND node = ?", repo, node); err != nil {
		return err
	}
	return tx.Commit()
}

// AwaitCopies waits, at most wait, for every copy of a new repository to
// be made (generation 0 or more), and returns how many are.
func AwaitCopies(ctx context.Context, db *store.DB, repo string, wait time.Duration) (int, error) {
	deadline := time.Now().Add(wait)
	for {
		var made, total int
		err := db.QueryRowContext(ctx, "SELECT count(*) FILTER (WHERE generation >= 0), count(*) FROM replicas WHERE repo = ?", repo).Scan(&made, &total)
		if err != nil || made == total || time.Now().After(deadline) {
			return made, err
		}
		select {
		case <-ctx.Done():
			return made, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
