//go:build linux

// Command chaos is packwire's nemesis suite: a real PostgreSQL and three
// `packwire serve` nodes (replicas 3), a workload of pushers (a new branch
// per push, and fast-forwards of one branch) and readers (HTTP, SSH and
// git:// against every node), under each nemesis in turn: kill -9 and
// SIGSTOP of the primary (also mid-push) and of a replica, PostgreSQL
// restarted, killed and down, one node's PostgreSQL connection
// blackholed, the primary partitioned from the replicas. After each, a
// checker reads every node's bare repository directly and the history:
//
//   - no acknowledged push lost: each is on every copy;
//   - no stale read: no read misses a push acknowledged before it started;
//   - every copy git fsck clean and equal to the others;
//
// and reports the longest window without an acknowledged push and the
// failover time: fault to PostgreSQL recording another primary, and to
// the first push a new primary acknowledged (pushers give up on a node
// that shows no progress for -push-stall, and try the next). The
// exit status is 1 on any loss, stale read or copy problem.
//
//	go run ./bench/chaos                     # every nemesis, 1 minute each
//	go run ./bench/chaos -duration 10m -out bench/CHAOS.md
//	go run ./bench/chaos -short              # the CI pass (bench/chaos's test)
//	go run ./bench/chaos -nemesis pause-replica,kill-primary
//
// Needs PostgreSQL's programs and the OpenSSH client (scripts/install-deps);
// as root PostgreSQL runs as the postgres user. Linux only (the partition
// tells nodes' connections apart by /proc). Everything listens on
// 127.0.0.1; every process is stopped at the end, on failure and on ^C.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"packwire/internal/server/cluster"
)

// defaultStall is how long a pusher waits without progress before it
// gives up on a node: the server says nothing while it replicates, and a
// small push to a well node took up to 3.5 s on the 2-core machine at a
// load average of 30 (3 s cut such pushes).
const defaultStall = 5 * time.Second

type options struct {
	nemeses     []nemesis
	duration    time.Duration
	short       bool
	out         string
	heartbeat   time.Duration
	nodeTimeout time.Duration
	readers     int
	stall       time.Duration // a push with no progress for this long is cut (0: never)
	keep        bool
	maxWindow   time.Duration // a repository taking no push for longer fails the phase (0: not checked)
	pushLog     string        // a file each phase's pushes and faults are appended to ("": none)
	log         io.Writer     // progress
}

func main() {
	var names string
	var o options
	flag.StringVar(&names, "nemesis", "", "comma-separated nemeses to run (default: all): "+nemesisNames())
	flag.DurationVar(&o.duration, "duration", time.Minute, "how long each nemesis keeps injecting faults (at least one cycle); the bench/CHAOS.md long run uses 10m")
	flag.BoolVar(&o.short, "short", false, "the CI pass: short faults, a few seconds per nemesis (-duration is ignored)")
	flag.StringVar(&o.out, "out", "", "also write the markdown report to FILE")
	flag.DurationVar(&o.heartbeat, "node-heartbeat", cluster.DefaultHeartbeat, "the nodes' --node-heartbeat")
	flag.DurationVar(&o.nodeTimeout, "node-timeout", cluster.DefaultNodeTimeout, "the nodes' --node-timeout")
	flag.IntVar(&o.readers, "readers", 3, "concurrent readers (HTTP, SSH and git:// in turn)")
	flag.DurationVar(&o.stall, "push-stall", defaultStall, "a push showing no progress for this long is cut and the pusher tries the next node, as a client behind a load balancer; 0: pushes wait for their node")
	flag.DurationVar(&o.maxWindow, "max-window", 0, "fail a phase in which a repository took no push for longer than this, from the first fault to the end (a wedge); 0: not checked, as the time depends on the machine")
	flag.BoolVar(&o.keep, "keep", false, "keep the data directories and node logs after a failed run")
	flag.StringVar(&o.pushLog, "push-log", "", "also append every push and fault, one a line in time order, to FILE (where a failover's seconds went)")
	flag.Parse()
	var err error
	if o.nemeses, err = pick(names); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	o.log = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	report, failed, err := run(ctx, o)
	os.Stdout.WriteString(report)
	if o.out != "" && report != "" {
		if werr := os.WriteFile(o.out, []byte(report), 0o644); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

func nemesisNames() string {
	var names []string
	for _, nm := range nemeses {
		names = append(names, nm.name)
	}
	return strings.Join(names, ",")
}

func pick(names string) ([]nemesis, error) {
	if names == "" {
		return nemeses, nil
	}
	var out []nemesis
	for _, name := range strings.Split(names, ",") {
		found := false
		for _, nm := range nemeses {
			if nm.name == strings.TrimSpace(name) {
				out = append(out, nm)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("no nemesis %q (there are %s)", name, nemesisNames())
		}
	}
	return out, nil
}

// run starts the cluster, runs every nemesis in turn and returns the
// markdown report, whether any check failed, and an error if the suite
// itself could not run.
func run(ctx context.Context, o options) (string, bool, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", false, err
	}
	fmt.Fprintf(o.log, "chaos: building packwire, starting PostgreSQL and 3 nodes\n")
	c, err := startCluster(ctx, root, o.heartbeat, o.nodeTimeout)
	if err != nil {
		return "", false, err
	}
	failed := false
	defer func() { c.stop(failed && o.keep) }()
	var results []phaseResult
	for i, nm := range o.nemeses {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(o.log, "chaos: %s\n", nm.name)
		r := runPhase(ctx, c, nm, i, o)
		fmt.Fprintf(o.log, "chaos: %s: %d pushes acknowledged, %d lost, %d stale reads, %d copy problems, %d repositories stuck%s\n",
			nm.name, r.pushesAcked, len(r.v.lost), len(r.v.stale), len(r.v.copies), len(r.v.stuck), errSuffix(r.err))
		failed = failed || r.failed()
		results = append(results, r)
	}
	var b bytes.Buffer
	reportHeader(&b, root, o)
	reportTable(&b, results)
	if failed && o.keep {
		fmt.Fprintf(&b, "Data directories and node logs kept in %s\n", c.base)
	}
	if ctx.Err() != nil {
		return b.String(), failed, errors.New("interrupted")
	}
	return b.String(), failed, nil
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return fmt.Sprintf(" (stopped: %v)", err)
}

// runPhase runs one nemesis against new repositories under the workload:
// a warm-up, the nemesis's cycles, a cool-down with the cluster healed,
// then the workload stops, the copies settle and the checker runs.
func runPhase(ctx context.Context, c *testCluster, nm nemesis, i int, o options) phaseResult {
	r := phaseResult{nm: nm}
	for k := 1; k <= 2; k++ {
		r.repos = append(r.repos, fmt.Sprintf("chaos%d-%s-%d", i, nm.name, k))
	}
	for _, repo := range r.repos {
		if _, err := c.admin(ctx, "repo", "create", repo); err != nil {
			r.err = err
			return r
		}
	}
	if err := c.waitSettled(ctx, r.repos, time.Minute); err != nil {
		r.err = fmt.Errorf("new repositories: %w", err)
		return r
	}
	warm, cool, duration := 5*time.Second, 10*time.Second, o.duration
	if o.short {
		warm, cool = 1500*time.Millisecond, 2*time.Second
	}
	h := &history{}
	dir := filepath.Join(c.base, "work", nm.name)
	os.MkdirAll(dir, 0o755)
	wctx, stopLoad := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		(&workload{c: c, h: h, repos: r.repos, dir: dir, readers: o.readers, stall: o.stall}).run(wctx, ctx)
		close(done)
	}()
	watched := make(chan struct{})
	go func() {
		h.watchPrimary(wctx, c, r.repos[0])
		close(watched)
	}()
	sleep(ctx, warm)
	from := time.Now()
	r.err = nm.cycles(ctx, c, h, r.repos[0], duration, o.short)
	sleep(ctx, cool)
	stopLoad()
	<-done
	<-watched
	to := time.Now()
	if ctx.Err() != nil {
		r.err = ctx.Err()
		return r
	}
	// The copies are read once settled; if the cluster's records moved
	// while they were read (a node finishing a catch-up), again.
	for attempt := 0; attempt < 3; attempt++ {
		settleErr := c.waitSettled(ctx, r.repos, time.Minute)
		if settleErr != nil {
			for _, n := range c.nodes {
				fmt.Fprintf(o.log, "chaos: node %s's last log lines:\n%s\n", n.name, n.lastLog(15))
			}
		}
		before := c.records(ctx, r.repos)
		r.v = check(ctx, c, h, r.repos, settleErr, from, to, nm.primary, o.maxWindow)
		if settleErr != nil || c.records(ctx, r.repos) == before {
			break
		}
	}
	summarize(&r, h)
	if r.failed() {
		r.records = c.dump(ctx, r.repos)
	}
	if o.pushLog != "" {
		if err := appendPushLog(o.pushLog, nm.name, h); err != nil {
			fmt.Fprintf(o.log, "chaos: -push-log: %v\n", err)
		}
	}
	return r
}

// moduleRoot is the directory of packwire's go.mod, above the working
// directory (go run and go test run from inside the module).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run from inside packwire's module (go run ./bench/chaos)")
		}
		dir = parent
	}
}
