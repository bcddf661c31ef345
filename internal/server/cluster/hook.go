package cluster

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"packwire/internal/access"
	"packwire/internal/store"
)

// LocalRefs is the namespace of refs each node keeps for itself
// (maintenance's; hidden from clients): never replicated or pruned.
const LocalRefs = "refs/packwire/"

// HookName is the reference-transaction hook's file name.
const HookName = "reference-transaction"

// The primary's receive-pack runs the reference-transaction hook (this
// binary) with these in its environment.
const (
	EnvDatabase = "PACKWIRE_CLUSTER_DATABASE"
	EnvRepo     = "PACKWIRE_CLUSTER_REPO"
	EnvNode     = "PACKWIRE_CLUSTER_NODE"
	EnvSecret   = "PACKWIRE_CLUSTER_SECRET"
	EnvTimeout  = "PACKWIRE_CLUSTER_TIMEOUT" // node timeout, a Go duration
	EnvPending  = "PACKWIRE_CLUSTER_PENDING" // directory of generations between prepared and committed
)

// replicateTimeout bounds one replica's push of one transaction.
const replicateTimeout = 2 * time.Minute

// update is one line of the hook's input: "<old> <new> <ref>".
type update struct{ old, new, ref string }

// RunHook is the reference-transaction hook of a push on the primary. In
// the "prepared" state (git holds the refs' locks, the pushed objects are
// in the quarantine, nothing is committed) it locks the repository's row,
// sends the update to every other replica (git push --atomic with each
// ref's old value as a lease, so a replica that is not at the same state
// refuses), and when a majority of the replicas, the primary counted,
// hold it, commits the next generation and the voters' generations in
// PostgreSQL. Only then does it exit 0 and git commit the primary's refs;
// otherwise git aborts and the client is told the push failed. Other
// states have nothing to do.
func RunHook(args []string, stdin io.Reader, stderr io.Writer) int {
	if len(args) < 1 || os.Getenv(EnvRepo) == "" {
		io.Copy(io.Discard, stdin)
		return 0
	}
	timeout, _ := time.ParseDuration(os.Getenv(EnvTimeout))
	if timeout <= 0 {
		timeout = DefaultNodeTimeout
	}
	h := hook{repo: os.Getenv(EnvRepo), node: os.Getenv(EnvNode), secret: os.Getenv(EnvSecret), timeout: timeout,
		pending: os.Getenv(EnvPending), databaseURL: os.Getenv(EnvDatabase)}
	switch args[0] {
	case "prepared":
	case "committed":
		io.Copy(io.Discard, stdin)
		if err := h.committed(); err != nil {
			// git has committed: the push stands; this copy is left marked
			// stale and is caught up (or its primary moved) by the nodes.
			fmt.Fprintf(stderr, "packwire: warning: %v\n", err)
		}
		return 0
	default: // aborted
		io.Copy(io.Discard, stdin)
		os.Remove(h.pendingFile())
		return 0
	}
	var updates []update
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// HEAD is listed when its branch moves: replicas move the branch.
		if len(f) == 3 && strings.HasPrefix(f[2], "refs/") && !strings.HasPrefix(f[2], LocalRefs) {
			updates = append(updates, update{f[0], f[1], f[2]})
		}
	}
	if len(updates) == 0 {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), replicateTimeout+30*time.Second)
	defer cancel()
	if err := h.replicate(ctx, updates); err != nil {
		fmt.Fprintf(stderr, "packwire: %v\n", err)
		return 1
	}
	return 0
}

type hook struct {
	repo, node, secret   string
	timeout              time.Duration
	pending, databaseURL string
}

// pendingFile carries the generation a push committed in PostgreSQL from
// the "prepared" call to the "committed" one: both are children of the
// same receive-pack, which names it.
func (h hook) pendingFile() string {
	return filepath.Join(h.pending, fmt.Sprintf("%d", os.Getppid()))
}

func (h hook) open() (*store.DB, error) {
	raw, err := sql.Open("pgx", h.databaseURL)
	if err != nil {
		return nil, err
	}
	return &store.DB{DB: raw, Engine: store.Postgres}, nil
}

// committed records that the primary's own copy now holds the generation
// its "prepared" call committed: only now, after git wrote the refs here,
// so that a primary killed in between is stale, not falsely current.
func (h hook) committed() error {
	b, err := os.ReadFile(h.pendingFile())
	if err != nil {
		return nil // nothing replicated (no refs/ updates)
	}
	os.Remove(h.pendingFile())
	gen, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return err
	}
	db, err := h.open()
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = db.ExecContext(ctx, "UPDATE replicas SET generation = ? WHERE repo = ? AND node = ? AND generation = ?", gen, h.repo, h.node, gen-1)
	return err
}

func (h hook) replicate(ctx context.Context, updates []update) error {
	db, err := h.open()
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("cluster: the store is unreachable, nothing was written: %w", err)
	}
	defer tx.Rollback()
	// The row lock orders pushes to one repository: each replicates from
	// the state the previous one committed.
	var primary string
	var gen, epoch int64
	if err := tx.QueryRowContext(ctx, "SELECT primary_node, generation, epoch FROM cluster_repos WHERE name = ? FOR UPDATE", h.repo).Scan(&primary, &gen, &epoch); err != nil {
		return fmt.Errorf("cluster: reading %s's placement: %w", h.repo, err)
	}
	if primary != h.node {
		return fmt.Errorf("cluster: this node is no longer %s's primary (%s is); nothing was written, push again", h.repo, primary)
	}
	// The push before this one may still be between its commit in
	// PostgreSQL and its committed call (which records this copy current):
	// wait for it a little, rather than refuse.
	var mine int64
	for wait := time.Now().Add(5 * time.Second); ; {
		if err := tx.QueryRowContext(ctx, "SELECT generation FROM replicas WHERE repo = ? AND node = ?", h.repo, h.node).Scan(&mine); err != nil {
			return err
		}
		if mine == gen || time.Now().After(wait) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if mine != gen {
		return fmt.Errorf("cluster: this node's copy of %s is behind (generation %d of %d) and is being caught up; nothing was written, push again shortly", h.repo, mine, gen)
	}
	rows, err := tx.QueryContext(ctx, `SELECT rp.node, nd.url, rp.generation, `+healthySQL+` FROM replicas rp
		JOIN nodes nd ON nd.name = rp.node WHERE rp.repo = ? ORDER BY rp.node`, h.timeout.Milliseconds(), h.repo)
	if err != nil {
		return err
	}
	var others []Replica
	total := 0
	for rows.Next() {
		var r Replica
		if err := rows.Scan(&r.Node, &r.URL, &r.Generation, &r.Healthy); err != nil {
			rows.Close()
			return err
		}
		total++
		if r.Node != h.node {
			others = append(others, r)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	// The primary counts towards the majority: git commits its refs once
	// this hook succeeds (its own generation is recorded then: committed).
	voters := []string{}
	var failures []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, r := range others {
		if !r.Healthy || r.Generation != gen {
			failures = append(failures, fmt.Sprintf("%s: not up to date or unhealthy", r.Node))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := pushTo(ctx, r.URL, h.repo, h.secret, updates)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failures = append(failures, fmt.Sprintf("%s: %v", r.Node, err))
				return
			}
			voters = append(voters, r.Node)
		}()
	}
	wg.Wait()
	if need := total/2 + 1; len(voters)+1 < need {
		return fmt.Errorf("cluster: only %d of %d replicas of %s took the push (%d needed); nothing was written: %s",
			len(voters)+1, total, h.repo, need, strings.Join(failures, "; "))
	}
	if err := os.WriteFile(h.pendingFile(), []byte(strconv.FormatInt(gen+1, 10)), 0o600); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	res, err := tx.ExecContext(ctx, "UPDATE cluster_repos SET generation = generation + 1, committed_ms = "+dbNowMS+" WHERE name = ? AND primary_node = ? AND epoch = ?", h.repo, h.node, epoch)
	if err != nil {
		return fmt.Errorf("cluster: committing the push: %w", err)
	}
	if k, _ := res.RowsAffected(); k != 1 {
		return fmt.Errorf("cluster: %s's primary changed during the push; nothing was written, push again", h.repo)
	}
	if len(voters) > 0 {
		args := []any{gen + 1, h.repo}
		marks := make([]string, len(voters))
		for i, v := range voters {
			marks[i] = "?"
			args = append(args, v)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE replicas SET generation = ? WHERE repo = ? AND node IN ("+strings.Join(marks, ", ")+")", args...); err != nil {
			return fmt.Errorf("cluster: committing the push: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("cluster: committing the push: %w", err)
	}
	return nil
}

// pushTo sends updates to one replica as the cluster user: one atomic
// push, each ref leased at its old value (a zero old id: the ref must not
// exist), from the primary's repository with its quarantine (git passes
// the quarantine's environment to the hook, and on to this git).
func pushTo(ctx context.Context, nodeURL, repo, secret string, updates []update) error {
	ctx, cancel := context.WithTimeout(ctx, replicateTimeout)
	defer cancel()
	args := []string{"push", "--atomic", "--porcelain", "--no-verify"}
	for _, u := range updates {
		old := u.old
		if isZero(old) {
			old = ""
		}
		args = append(args, "--force-with-lease="+u.ref+":"+old)
	}
	args = append(args, RepoURL(nodeURL, repo))
	for _, u := range updates {
		if isZero(u.new) {
			args = append(args, ":"+u.ref)
		} else {
			args = append(args, "+"+u.new+":"+u.ref)
		}
	}
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = append(os.Environ(), AuthEnv(secret)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, LastLines(string(out), 3))
	}
	return nil
}

// RepoURL is a repository on a node's HTTP listener.
func RepoURL(nodeURL, repo string) string {
	return strings.TrimRight(nodeURL, "/") + "/" + repo
}

// AuthEnv gives git the cluster user's credentials as an extra header
// through its environment (never its command line, which other users of
// the machine can read).
func AuthEnv(secret string) []string {
	basic := base64.StdEncoding.EncodeToString([]byte(access.ClusterUser + ":" + secret))
	return []string{"GIT_CONFIG_COUNT=2",
		"GIT_CONFIG_KEY_0=http.extraHeader", "GIT_CONFIG_VALUE_0=Authorization: Basic " + basic,
		"GIT_CONFIG_KEY_1=credential.helper", "GIT_CONFIG_VALUE_1=",
		"GIT_TERMINAL_PROMPT=0"}
}

func isZero(id string) bool { return strings.Trim(id, "0") == "" }

// LastLines is the end of git's output, for an error message.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
