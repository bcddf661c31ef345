//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"packwire/internal/pgtest"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

// testCluster is the system under test: one PostgreSQL, three packwire
// serve processes in cluster mode (replicas 3), and the proxies the
// suite cuts: each node reaches PostgreSQL through a proxy of its own,
// and the other nodes through theirs (each node's --node-url is its proxy).
type testCluster struct {
	base    string // temporary directory of everything
	bin     string // the packwire binary, packwire-hook next to it
	pg      *pgtest.Server
	url     string // the cluster's database, directly
	db      *store.Store
	nodes   []*node
	git     *gitEnv
	token   string // the workload user's HTTP password
	timeout time.Duration
	beat    time.Duration
	pgDown  bool // halted or killed by a nemesis, not yet resumed
}

// node is one packwire serve process and its proxies.
type node struct {
	name, dir string
	pgProxy   *proxy // this node -> PostgreSQL
	peerProxy *proxy // the other nodes -> this node
	log       string

	mu                         sync.Mutex
	cmd                        *exec.Cmd
	exited                     chan struct{}
	httpAddr, gitAddr, sshAddr string
	dead, paused               bool
}

const workloadUser = "chaos"

// startCluster builds packwire, starts PostgreSQL and the three nodes,
// and makes the workload's user (an HTTP token and an SSH key).
func startCluster(ctx context.Context, root string, heartbeat, timeout time.Duration) (*testCluster, error) {
	base, err := os.MkdirTemp("", "packwire-chaos-")
	if err != nil {
		return nil, err
	}
	c := &testCluster{base: base, timeout: timeout, beat: heartbeat}
	fail := func(err error) (*testCluster, error) {
		c.stop(false)
		return nil, err
	}
	binDir := filepath.Join(base, "bin")
	c.bin = filepath.Join(binDir, "packwire")
	for _, b := range []struct{ out, pkg string }{{c.bin, "./cmd/packwire"}, {filepath.Join(binDir, "packwire-hook"), "./cmd/packwire-hook"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.out, b.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fail(fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out))
		}
	}
	if c.pg, err = pgtest.Launch(); err != nil {
		return fail(err)
	}
	if c.url, err = c.pg.CreateDatabase(); err != nil {
		return fail(err)
	}
	if c.db, err = store.OpenPostgres(ctx, c.url); err != nil {
		return fail(err)
	}
	if c.git, err = newGitEnv(filepath.Join(base, "home")); err != nil {
		return fail(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		n := &node{name: name, dir: filepath.Join(base, name), log: filepath.Join(base, name+".log")}
		pgAddr := fmt.Sprintf("127.0.0.1:%d", c.pg.Port())
		if n.pgProxy, err = newProxy(func() string { return pgAddr }); err != nil {
			return fail(err)
		}
		if n.peerProxy, err = newProxy(n.addrHTTP); err != nil {
			return fail(err)
		}
		n.peerProxy.source = func(remote net.Addr) string { return sourceNode(remote, c.pids) }
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := c.start(n); err != nil {
			return fail(err)
		}
	}
	if _, err := c.admin(ctx, "user", "add", workloadUser); err != nil {
		return fail(err)
	}
	if _, err := c.admin(ctx, "grant", workloadUser, "write", "**"); err != nil {
		return fail(err)
	}
	out, err := c.admin(ctx, "token", "create", workloadUser)
	if err != nil {
		return fail(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	c.token = lines[len(lines)-1]
	if _, err := c.admin(ctx, "key", "add", workloadUser, c.git.key+".pub"); err != nil {
		return fail(err)
	}
	return c, nil
}

// nodeURL is the database URL a node uses: PostgreSQL through its proxy.
func (c *testCluster) nodeURL(n *node) string {
	return strings.Replace(c.url, fmt.Sprintf("127.0.0.1:%d", c.pg.Port()), n.pgProxy.Addr(), 1)
}

// start runs n's packwire serve and waits for its listeners.
func (c *testCluster) start(n *node) error {
	cmd := exec.Command(c.bin, "serve", "--data", n.dir, "--database", c.nodeURL(n), "--node", n.name,
		"--node-url", "http://"+n.peerProxy.Addr(), "--node-heartbeat", c.beat.String(), "--node-timeout", c.timeout.String(),
		"--git", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ssh", "127.0.0.1:0", "--maintain-interval", "0")
	// A process group of its own: a pause or a kill takes the node with the
	// git processes it runs, as a machine's would; it dies with the suite.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logFile, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stderr = logFile
	out, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return err
	}
	exited := make(chan struct{})
	ready := make(chan [3]string, 1)
	go func() {
		var addrs [3]string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logFile, line)
			if _, a, ok := strings.Cut(line, "git://   listening on "); ok {
				addrs[0] = a
			}
			if _, a, ok := strings.Cut(line, "ssh://   listening on "); ok {
				addrs[2], _, _ = strings.Cut(a, ",")
			}
			if _, a, ok := strings.Cut(line, "http://  listening on "); ok {
				addrs[1] = a
			}
			if addrs[0] != "" && addrs[1] != "" && addrs[2] != "" {
				select {
				case ready <- addrs:
				default:
				}
			}
		}
		cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	select {
	case addrs := <-ready:
		n.mu.Lock()
		n.cmd, n.exited, n.dead, n.paused = cmd, exited, false, false
		n.gitAddr, n.httpAddr, n.sshAddr = addrs[0], addrs[1], addrs[2]
		n.mu.Unlock()
		return nil
	case <-exited:
		return fmt.Errorf("node %s exited at start (log %s)", n.name, n.log)
	case <-time.After(60 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		return fmt.Errorf("node %s did not start within 60 s (log %s)", n.name, n.log)
	}
}

func (n *node) addrHTTP() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.httpAddr
}

// kill sends SIGKILL to n's process group and waits for the node to exit.
func (c *testCluster) kill(n *node) {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.dead = true
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// pause and resume stop and continue n's process group.
func (c *testCluster) pause(n *node) { c.signal(n, syscall.SIGSTOP, true) }

func (c *testCluster) resume(n *node) { c.signal(n, syscall.SIGCONT, false) }

func (c *testCluster) signal(n *node, sig syscall.Signal, paused bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && !n.dead {
		syscall.Kill(-n.cmd.Process.Pid, sig)
		n.paused = paused
	}
}

// heal undoes every fault: nodes resumed or restarted, proxies open,
// PostgreSQL running.
func (c *testCluster) heal() error {
	var errs []error
	if c.pgDown {
		errs = append(errs, c.pgResume())
	}
	for _, n := range c.nodes {
		n.pgProxy.setCut(nil)
		n.peerProxy.setCut(nil)
		c.resume(n)
		n.mu.Lock()
		dead := n.dead
		n.mu.Unlock()
		if dead {
			errs = append(errs, c.start(n))
		}
	}
	return errors.Join(errs...)
}

// pgHalt, pgKill and pgResume stop PostgreSQL (fast shutdown, SIGKILL)
// and start it again.
func (c *testCluster) pgHalt() { c.pg.Halt(); c.pgDown = true }

func (c *testCluster) pgKill() { c.pg.Kill(); c.pgDown = true }

func (c *testCluster) pgResume() error {
	if err := c.pg.Resume(); err != nil {
		return fmt.Errorf("PostgreSQL did not start again: %w", err)
	}
	c.pgDown = false
	return nil
}

// live is the nodes not killed (paused ones included: clients of a paused
// machine wait). Clients keep off killed nodes' ports, as a load balancer
// with health checks would.
func (c *testCluster) live() []*node {
	var out []*node
	for _, n := range c.nodes {
		n.mu.Lock()
		if !n.dead {
			out = append(out, n)
		}
		n.mu.Unlock()
	}
	return out
}

// pids maps each running node's pid to its name (the partition's proxies
// attribute connections by process).
func (c *testCluster) pids() map[int]string {
	m := map[int]string{}
	for _, n := range c.nodes {
		n.mu.Lock()
		if n.cmd != nil && !n.dead {
			m[n.cmd.Process.Pid] = n.name
		}
		n.mu.Unlock()
	}
	return m
}

func (c *testCluster) byName(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// admin runs a packwire admin command against the cluster's database.
func (c *testCluster) admin(ctx context.Context, args ...string) (string, error) {
	args = append(args, "--data", filepath.Join(c.base, "nowhere"), "--database", c.url)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.bin, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("packwire %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// placement reads the cluster's view of repo from PostgreSQL, directly
// (no proxy), within a second.
func (c *testCluster) placement(ctx context.Context, repo string) (cluster.Placement, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return cluster.Locate(ctx, c.db.DB, repo, c.timeout)
}

// settled tells whether every copy of repo is on a healthy node and
// recorded at the repository's generation.
func settled(p cluster.Placement) bool {
	ok := len(p.Replicas) == 3
	for _, r := range p.Replicas {
		ok = ok && r.Healthy && r.Generation == p.Generation
	}
	return ok
}

// records is what the cluster records of repos' copies, to compare.
func (c *testCluster) records(ctx context.Context, repos []string) string {
	var b strings.Builder
	for _, r := range repos {
		p, err := c.placement(ctx, r)
		fmt.Fprintf(&b, "%s %s %d %+v %v;", r, p.Primary, p.Generation, p.Replicas, err)
	}
	return b.String()
}

// dump is what PostgreSQL records of each repo (its row of
// cluster_repos, each copy's generation) next to the digest of each
// node's copy on disk (cluster.CopyDigest): a failed phase's report
// tells from it whether a copy's refs are the generation's (issue 29,
// where PostgreSQL's data was gone with the cluster).
func (c *testCluster) dump(ctx context.Context, repos []string) []string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var out []string
	for _, r := range repos {
		var primary, digest, holder string
		var epoch, gen, digestGen, turn int64
		err := c.db.DB.QueryRowContext(ctx, `SELECT primary_node, epoch, generation, COALESCE(digest, ''), COALESCE(digest_generation, -1), push_turn, push_holder
			FROM cluster_repos WHERE name = ?`, r).Scan(&primary, &epoch, &gen, &digest, &digestGen, &turn, &holder)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: reading cluster_repos: %v", r, err))
			continue
		}
		recorded := map[string]int64{}
		rows, err := c.db.DB.QueryContext(ctx, "SELECT node, generation FROM replicas WHERE repo = ?", r)
		if err == nil {
			for rows.Next() {
				var n string
				var g int64
				if rows.Scan(&n, &g) == nil {
					recorded[n] = g
				}
			}
			rows.Close()
		}
		line := fmt.Sprintf("%s: primary %s, epoch %d, generation %d, digest %.12s (of generation %d), push turn %d held by %q; copies:",
			r, primary, epoch, gen, digest, digestGen, turn, holder)
		for _, n := range c.nodes {
			got, derr := cluster.CopyDigest(filepath.Join(n.dir, "repos", r+".git"))
			if derr != nil {
				got = derr.Error()
			}
			g, ok := recorded[n.name]
			at := "no record"
			if ok {
				at = fmt.Sprintf("recorded at %d", g)
			}
			same := ""
			if digest != "" && got == digest {
				same = " (the generation's)"
			}
			line += fmt.Sprintf(" %s %s, refs %.12s%s;", n.name, at, got, same)
		}
		out = append(out, line)
	}
	return out
}

// waitSettled waits until every repo is settled, or within passes.
func (c *testCluster) waitSettled(ctx context.Context, repos []string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var behind []string
		for _, r := range repos {
			p, err := c.placement(ctx, r)
			if err != nil || !settled(p) {
				behind = append(behind, fmt.Sprintf("%s %+v %v", r, p.Replicas, err))
			}
		}
		if len(behind) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not settled within %s: %s", within, strings.Join(behind, "; "))
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop ends every process the suite started and removes its files,
// unless keep (a failure's logs are worth reading).
func (c *testCluster) stop(keep bool) {
	c.shutdown()
	if !keep {
		os.RemoveAll(c.base)
	}
}

func (c *testCluster) shutdown() {
	for _, n := range c.nodes {
		c.kill(n)
		if n.pgProxy != nil {
			n.pgProxy.Close()
		}
		if n.peerProxy != nil {
			n.peerProxy.Close()
		}
	}
	if c.db != nil {
		c.db.Close()
	}
	if c.pg != nil {
		c.pg.Stop()
	}
}

// lastLog is the end of n's log, for a report of what went wrong.
func (n *node) lastLog(lines int) string {
	b, _ := os.ReadFile(n.log)
	return cluster.LastLines(string(b), lines)
}
