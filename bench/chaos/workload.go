//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// gitEnv runs the real git client with an isolated HOME and an SSH key
// the workload's user owns.
type gitEnv struct {
	vars []string
	key  string // private key file; its .pub is registered
}

func newGitEnv(home string) (*gitEnv, error) {
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, err
	}
	key := filepath.Join(home, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ssh-keygen (the OpenSSH client is needed: scripts/install-deps): %v %s", err, out)
	}
	return &gitEnv{key: key, vars: []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C",
		"GIT_AUTHOR_NAME=Chaos", "GIT_AUTHOR_EMAIL=chaos@example.com", "GIT_COMMITTER_NAME=Chaos", "GIT_COMMITTER_EMAIL=chaos@example.com",
		"GIT_SSH_COMMAND=ssh -F /dev/null -i " + key + " -o IdentitiesOnly=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes -o ConnectTimeout=10"}}, nil
}

// command is git in dir, killed with whatever it started (ssh, remote
// helpers) as a group when ctx ends.
func (g *gitEnv) command(ctx context.Context, dir string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = g.vars
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// run runs git in dir within timeout; on the timeout (or ctx's end) git
// and whatever it started (ssh, remote helpers) are killed as a group.
func (g *gitEnv) run(ctx context.Context, timeout time.Duration, dir string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := g.command(ctx, dir, args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// output is run for a command whose standard output is data (ls-remote,
// for-each-ref): stdout apart, and on failure stdout and stderr for the
// message. Combined, a line of ssh's stderr written between two of git's
// buffered writes split a ref line of ls-remote's: the long run's only
// "stale read" was such a line, its object name cut after 11 digits.
func (g *gitEnv) output(ctx context.Context, timeout time.Duration, dir string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := g.command(ctx, dir, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// runStalling is run for a client behind a load balancer: git is also
// killed (with its group) once it has written nothing for stall, as a
// client that gives up on a server making no progress (a paused or cut
// off node) and tries the next one. stall <= 0: no such deadline.
func (g *gitEnv) runStalling(ctx context.Context, stall, timeout time.Duration, dir string, args ...string) (out string, stalled bool, err error) {
	if stall <= 0 {
		out, err = g.run(ctx, timeout, dir, args...)
		return out, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := g.command(ctx, dir, args...)
	w := &progressWriter{}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		return "", false, err
	}
	var gaveUp atomic.Bool
	watch := time.AfterFunc(stall, func() {
		gaveUp.Store(true)
		cancel()
	})
	w.onWrite = func() { watch.Reset(stall) }
	err = cmd.Wait()
	watch.Stop()
	return w.String(), gaveUp.Load() && err != nil, err
}

// progressWriter collects a command's output and calls onWrite on each
// write (git's progress lines are its sign of life).
type progressWriter struct {
	mu      sync.Mutex
	b       strings.Builder
	onWrite func()
}

func (w *progressWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.onWrite != nil {
		w.onWrite()
	}
	return w.b.Write(p)
}

func (w *progressWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// The transports clients use; pushes go over HTTP and SSH.
const (
	overHTTP = "http"
	overSSH  = "ssh"
	overGit  = "git"
)

func (c *testCluster) repoURL(n *node, transport, repo string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch transport {
	case overSSH:
		return fmt.Sprintf("ssh://git@%s/%s", n.sshAddr, repo)
	case overGit:
		return fmt.Sprintf("git://%s/%s", n.gitAddr, repo)
	}
	return fmt.Sprintf("http://%s:%s@%s/%s", workloadUser, c.token, n.httpAddr, repo)
}

// Push kinds: a new branch per push (no later push touches it, so a lost
// one stays visible), or the next commit of a branch fast-forwarded.
const (
	branchPerPush = "branch"
	fastForward   = "ff"
)

// pushRecord is one push as the client saw it.
type pushRecord struct {
	repo, kind, ref, commit string
	pusher, index           int // the pusher and the commit's place in its chain
	node, transport         string
	start, end              time.Time
	acked                   bool
	stalled                 bool   // cut by the client: no progress for the workload's stall
	primaryAfter            string // the repository's primary read right after the acknowledgement
	out                     string // the client's last lines when not acknowledged
}

// readRecord is one read: which node, when, what refs it saw, and whether
// the cluster recorded that node's copy current just before.
type readRecord struct {
	repo, node, transport string
	start, end            time.Time
	ok                    bool
	refs                  map[string]string
	recorded              string // "current", "behind" or "unknown" (PostgreSQL not answering)
	out                   string
}

// history is everything the clients did in one phase.
type history struct {
	mu     sync.Mutex
	pushes []pushRecord
	reads  []readRecord
	events []event
	chains map[string][]string // fast-forward pusher key -> its commits in order
	// primaries are the watched repository's primary as PostgreSQL
	// recorded it, each change with when it was first seen.
	primaries []primarySeen

	inFlight atomic.Int64 // pushes under way (the mid-push pause waits for one)
}

func (h *history) addPush(p pushRecord) {
	h.mu.Lock()
	h.pushes = append(h.pushes, p)
	h.mu.Unlock()
}

func (h *history) addRead(r readRecord) {
	h.mu.Lock()
	h.reads = append(h.reads, r)
	h.mu.Unlock()
}

// primarySeen is a repository's primary read from PostgreSQL at a time.
type primarySeen struct {
	at      time.Time
	primary string
}

// watchPrimary polls repo's primary in PostgreSQL (directly, not through
// any node's proxy) every 50 ms until ctx ends, and records each change:
// the failover as the cluster's tables show it, apart from any client.
func (h *history) watchPrimary(ctx context.Context, c *testCluster, repo string) {
	last := ""
	for ctx.Err() == nil {
		if p, err := c.placement(ctx, repo); err == nil && p.Primary != last {
			last = p.Primary
			h.mu.Lock()
			h.primaries = append(h.primaries, primarySeen{at: time.Now(), primary: p.Primary})
			h.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (h *history) addEvent(e event) {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
}

// workload runs the pushers and readers on repos until ctx ends.
type workload struct {
	c       *testCluster
	h       *history
	repos   []string
	dir     string
	readers int
	stall   time.Duration // a push with no progress for this long is cut (0: never)
}

// run runs the workload until stopping ends; then each client finishes
// what it is doing (a push cut by the client could land on some copies
// after the checker has read them). Clients' git commands end only with
// hard (^C).
func (w *workload) run(stopping, ctx context.Context) {
	var wg sync.WaitGroup
	for r, repo := range w.repos {
		for _, kind := range []string{branchPerPush, fastForward} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.push(stopping, ctx, repo, kind, r)
			}()
		}
	}
	for i := 0; i < w.readers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.read(stopping, ctx, i)
		}()
	}
	wg.Wait()
}

// gitFailed reports a local git command that failed, unless the phase
// ended under it.
func (w *workload) gitFailed(ctx context.Context, what string, err error, out string) {
	if ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "chaos: %s: %v %s\n", what, err, out)
	}
}

// pickNode spreads requests over the live nodes.
func (w *workload) pickNode(i int) *node {
	live := w.c.live()
	if len(live) == 0 {
		return nil
	}
	return live[i%len(live)]
}

// push commits and pushes in a loop: a new branch each time, or the next
// fast-forward of one branch; to a live node (another relays to the
// primary), over HTTP and SSH in turn.
func (w *workload) push(stopping, ctx context.Context, repo, kind string, pusher int) {
	g := w.c.git
	work := filepath.Join(w.dir, fmt.Sprintf("%s-%s", repo, kind))
	if out, err := g.run(ctx, time.Minute, "", "init", "-q", "-b", "main", work); err != nil {
		w.gitFailed(ctx, "git init", err, out)
		return
	}
	key := repo + " " + kind
	for n := 0; stopping.Err() == nil; n++ {
		os.WriteFile(filepath.Join(work, "f"), []byte(fmt.Sprintf("%s %d\n", key, n)), 0o644)
		if out, err := g.run(ctx, time.Minute, work, "add", "f"); err != nil {
			w.gitFailed(ctx, "git add", err, out)
			return
		}
		if out, err := g.run(ctx, time.Minute, work, "commit", "-qm", fmt.Sprintf("%s %d", key, n)); err != nil {
			w.gitFailed(ctx, "git commit", err, out)
			return
		}
		head, err := g.run(ctx, time.Minute, work, "rev-parse", "HEAD")
		if err != nil {
			return
		}
		head = strings.TrimSpace(head)
		ref := "refs/heads/ff"
		if kind == branchPerPush {
			ref = fmt.Sprintf("refs/heads/b-%d", n)
		} else {
			w.h.mu.Lock()
			if w.h.chains == nil {
				w.h.chains = map[string][]string{}
			}
			w.h.chains[repo] = append(w.h.chains[repo], head)
			w.h.mu.Unlock()
		}
		nd := w.pickNode(n + pusher)
		if nd == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		transport := overHTTP
		if n%2 == 1 {
			transport = overSSH
		}
		rec := pushRecord{repo: repo, kind: kind, ref: ref, commit: head, pusher: pusher, index: n, node: nd.name, transport: transport, start: time.Now()}
		w.h.inFlight.Add(1)
		out, stalled, err := g.runStalling(ctx, w.stall, time.Minute, work, "push", "--progress", "--porcelain", w.c.repoURL(nd, transport, repo), "HEAD:"+ref)
		w.h.inFlight.Add(-1)
		rec.end = time.Now()
		rec.stalled = stalled
		if ctx.Err() != nil && err != nil {
			// Cut by ^C: not an answer of the server's.
			return
		}
		rec.acked = err == nil
		if rec.acked {
			if p, err := w.c.placement(context.Background(), repo); err == nil {
				rec.primaryAfter = p.Primary
			}
		} else {
			rec.out = lastLines(out, 3)
			if stalled {
				rec.out = fmt.Sprintf("(cut by the client: no progress for %s)", w.stall)
			}
		}
		w.h.addPush(rec)
		if !rec.acked {
			// Not a synchronisation: a pause before trying again, as a
			// client's retry would.
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// read lists a repository's refs (every fifth time a full clone) from one
// node after another over one transport, recording what the cluster said
// of that node's copy just before.
func (w *workload) read(stopping, ctx context.Context, reader int) {
	g := w.c.git
	transport := []string{overHTTP, overSSH, overGit}[reader%3]
	for n := 0; stopping.Err() == nil; n++ {
		repo := w.repos[n%len(w.repos)]
		nd := w.pickNode(n/len(w.repos) + reader)
		if nd == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		rec := readRecord{repo: repo, node: nd.name, transport: transport, recorded: "unknown"}
		if p, err := w.c.placement(ctx, repo); err == nil {
			rec.recorded = "behind"
			if r, ok := p.Replica(nd.name); ok && r.Healthy && r.Generation == p.Generation {
				rec.recorded = "current"
			}
		}
		url := w.c.repoURL(nd, transport, repo)
		rec.start = time.Now()
		var out string
		var err error
		if n%5 == 4 {
			clone := filepath.Join(w.dir, fmt.Sprintf("clone-%d", reader))
			os.RemoveAll(clone)
			if out, err = g.run(ctx, time.Minute, "", "clone", "-q", "--mirror", url, clone); err == nil {
				out, err = g.output(ctx, time.Minute, clone, "for-each-ref", "--format=%(objectname)\t%(refname)")
			}
			os.RemoveAll(clone)
		} else {
			out, err = g.output(ctx, time.Minute, "", "ls-remote", url)
		}
		rec.end = time.Now()
		if ctx.Err() != nil && err != nil {
			return
		}
		rec.ok = err == nil
		if rec.ok {
			if rec.refs, err = parseRefs(out); err != nil {
				rec.ok, rec.out = false, err.Error()
			}
		}
		if !rec.ok {
			rec.out = lastLines(out, 3)
			time.Sleep(100 * time.Millisecond)
		}
		w.h.addRead(rec)
	}
}

// parseRefs reads "<oid>\t<ref>" lines (ls-remote, for-each-ref); a
// line that is neither such a line nor blank is an error (output the
// checker cannot trust), not a ref missing.
func parseRefs(out string) (map[string]string, error) {
	refs := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			continue
		}
		oid, ref, ok := strings.Cut(line, "\t")
		if !ok || !validOID(oid) || ref == "" {
			return nil, fmt.Errorf("malformed ref line %q", line)
		}
		if strings.HasPrefix(ref, "refs/") && !strings.HasSuffix(ref, "^{}") {
			refs[ref] = oid
		}
	}
	return refs, nil
}

func validOID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// lastLines is the last n non-blank lines of s, joined with " | ".
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
