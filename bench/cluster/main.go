// Command cluster measures what the cluster costs and how fast it fails
// over, against a single node in the same run:
//
//   - push wall: a one-commit push over HTTP to a single packwire (SQLite)
//     against the same push to a three-node cluster's primary (replicated
//     to a majority before the report) and to another node (relayed), in
//     interleaved rounds; medians and per-pair ratio medians;
//
//   - read throughput: 16 concurrent clones spread over the three nodes
//     against the same 16 on the single node (clones per second);
//
//   - failover: the primary's node stopped, then pushes to another node
//     until one is accepted; kill to first accepted push, median of
//     several kills (each node restarted and caught up between kills).
//
//     go run ./bench/cluster -rounds 15 -kills 5
//
// Needs PostgreSQL's programs (scripts/install-deps); as root they run as
// the postgres user.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"packwire/internal/lab/compare"
	"packwire/internal/pgtest"
	"packwire/internal/server"
	"packwire/internal/server/cluster"
	"packwire/internal/store"
)

func main() {
	rounds := flag.Int("rounds", 15, "interleaved push rounds")
	kills := flag.Int("kills", 5, "failovers to time")
	clones := flag.Int("clones", 16, "concurrent clones of the read test")
	flag.Parse()
	log.SetFlags(0)

	pg, err := pgtest.Launch()
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Stop()
	url, err := pg.CreateDatabase()
	if err != nil {
		log.Fatal(err)
	}
	base, err := os.MkdirTemp("", "packwire-bench-cluster-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(base)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The nodes run in this process: their reference-transaction hook is
	// the small packwire-hook, built here, as when installed next to
	// packwire.
	hook := filepath.Join(base, "packwire-hook")
	if out, err := exec.Command("go", "build", "-o", hook, "./cmd/packwire-hook").CombinedOutput(); err != nil {
		log.Fatalf("building packwire-hook: %v\n%s", err, out)
	}
	start := func(dir, node string) *server.Server {
		cfg := server.Defaults
		cfg.DataDir = dir
		cfg.GitAddr, cfg.HTTPAddr, cfg.SSHAddr = "127.0.0.1:0", "127.0.0.1:0", ""
		cfg.Log = quiet
		cfg.MaintainInterval = 0
		if node != "" {
			cfg.Database, cfg.Node, cfg.ClusterHook = url, node, hook
			cfg.NodeHeartbeat, cfg.NodeTimeout = 200*time.Millisecond, time.Second
		}
		s, err := server.New(context.Background(), cfg)
		if err != nil {
			log.Fatal(err)
		}
		if err := s.Start(); err != nil {
			log.Fatal(err)
		}
		return s
	}
	stop := func(s *server.Server) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	}

	single := start(filepath.Join(base, "single"), "")
	defer stop(single)
	nodes := map[string]*server.Server{}
	for _, n := range []string{"a", "b", "c"} {
		nodes[n] = start(filepath.Join(base, n), n)
	}
	defer func() {
		for _, s := range nodes {
			stop(s)
		}
	}()
	ctx := context.Background()
	st, err := store.OpenPostgres(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	if _, err := cluster.Place(ctx, st.DB, "app", "", 3, time.Second); err != nil {
		log.Fatal(err)
	}
	if _, err := single.Data.Repos.Create(ctx, "app"); err != nil {
		log.Fatal(err)
	}
	// One user and token for both: the single node's SQLite, the cluster's PostgreSQL.
	token := func(s *server.Server) string {
		s.Data.Store.AddUser(ctx, "bench")
		s.Data.Store.SetGrant(ctx, store.Grant{User: "bench", RepoPattern: "**", Role: "write"})
		t, err := s.Data.Access.CreateToken(ctx, "bench", 0)
		if err != nil {
			log.Fatal(err)
		}
		return t
	}
	singleToken, clusterToken := token(single), token(nodes["a"])
	primary := waitSettled(st.DB, "app")
	var other string
	for n := range nodes {
		if n != primary {
			other = n
			break
		}
	}
	env := newGitEnv(base)
	work := filepath.Join(base, "work")
	env.Git("", "init", "-q", "-b", "main", work)
	n := 0
	commit := func() {
		n++
		os.WriteFile(filepath.Join(work, "bench.txt"), []byte(fmt.Sprintf("%d\n", n)), 0o644)
		env.Git(work, "add", ".")
		env.Git(work, "commit", "-qm", fmt.Sprint(n))
	}
	pushURL := func(s *server.Server, tok string) string {
		return fmt.Sprintf("http://bench:%s@%s/app", tok, s.HTTPAddr)
	}
	timePush := func(url, ref string) time.Duration {
		commit()
		t0 := time.Now()
		if out, err := env.Run(work, nil, "push", "-q", "-f", url, "HEAD:"+ref); err != nil {
			log.Fatalf("push %s: %v\n%s", url, err, out)
		}
		return time.Since(t0)
	}
	// A history once everywhere, then single-commit pushes.
	for i := 0; i < 100; i++ {
		os.WriteFile(filepath.Join(work, fmt.Sprintf("f%d.txt", i%10)), []byte(strings.Repeat(fmt.Sprintf("line %d\n", i), 200)), 0o644)
		env.Git(work, "add", ".")
		env.Git(work, "commit", "-qm", fmt.Sprint("history ", i))
	}
	timePush(pushURL(single, singleToken), "refs/heads/main")
	timePush(pushURL(nodes[primary], clusterToken), "refs/heads/main")
	var one, repl, relayed []time.Duration
	for r := 0; r < *rounds; r++ {
		order := []int{0, 1, 2}
		if r%2 == 1 {
			order = []int{2, 1, 0}
		}
		for _, k := range order {
			switch k {
			case 0:
				one = append(one, timePush(pushURL(single, singleToken), "refs/heads/main"))
			case 1:
				repl = append(repl, timePush(pushURL(nodes[primary], clusterToken), "refs/heads/main"))
			case 2:
				relayed = append(relayed, timePush(pushURL(nodes[other], clusterToken), "refs/heads/main"))
			}
		}
	}
	fmt.Printf("# packwire cluster benchmark\n\n")
	fmt.Printf("- Date: %s; %d CPUs; git %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), cpus(), strings.TrimSpace(env.Git("", "version")))
	fmt.Printf("- Three nodes and one single node in one process each on 127.0.0.1, PostgreSQL 15 on loopback (fsync off), a 100-commit repository; one-commit pushes over HTTP, %d interleaved rounds\n\n", *rounds)
	fmt.Printf("| push | median wall | vs single node (median of per-pair ratios, 95%% CI) |\n|---|---:|---:|\n")
	fmt.Printf("| single node (SQLite) | %s | 1 |\n", ms(compare.Median(one)))
	fmt.Printf("| cluster primary (replicated to a majority) | %s | %s |\n", ms(compare.Median(repl)), ratio(repl, one))
	fmt.Printf("| another node (relayed to the primary) | %s | %s |\n\n", ms(compare.Median(relayed)), ratio(relayed, one))

	// Reads: a herd of clones on one node against the same herd spread over three.
	herd := func(urls []string) time.Duration {
		var wg sync.WaitGroup
		t0 := time.Now()
		for i := 0; i < *clones; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dir := filepath.Join(base, fmt.Sprintf("clone-%d-%d", time.Now().UnixNano(), i))
				if out, err := env.Run("", nil, "clone", "-q", "--bare", urls[i%len(urls)], dir); err != nil {
					log.Fatalf("clone: %v\n%s", err, out)
				}
				os.RemoveAll(dir)
			}()
		}
		wg.Wait()
		return time.Since(t0)
	}
	var oneHerd, spreadHerd []time.Duration
	spread := []string{fmt.Sprintf("git://%s/app", nodes["a"].GitAddr), fmt.Sprintf("git://%s/app", nodes["b"].GitAddr), fmt.Sprintf("git://%s/app", nodes["c"].GitAddr)}
	for r := 0; r < 5; r++ {
		oneHerd = append(oneHerd, herd([]string{fmt.Sprintf("git://%s/app", single.GitAddr)}))
		spreadHerd = append(spreadHerd, herd(spread))
	}
	fmt.Printf("| %d concurrent clones (git://) | median wall | clones/s |\n|---|---:|---:|\n", *clones)
	fmt.Printf("| single node | %s | %.1f |\n", ms(compare.Median(oneHerd)), float64(*clones)/compare.Median(oneHerd).Seconds())
	fmt.Printf("| spread over three nodes (one machine, 2 CPUs: the nodes share them) | %s | %.1f |\n\n", ms(compare.Median(spreadHerd)), float64(*clones)/compare.Median(spreadHerd).Seconds())

	// Failover: stop the primary, push to another node until accepted.
	var failovers []time.Duration
	for k := 0; k < *kills; k++ {
		primary = waitSettled(st.DB, "app")
		var target string
		for n := range nodes {
			if n != primary {
				target = n
				break
			}
		}
		dir := nodes[primary].Data.Dir
		t0 := time.Now()
		stop(nodes[primary])
		commit()
		for {
			if _, err := env.Run(work, nil, "push", "-q", "-f", pushURL(nodes[target], clusterToken), "HEAD:refs/heads/main"); err == nil {
				break
			}
			if time.Since(t0) > time.Minute {
				log.Fatal("no push accepted a minute after the kill")
			}
			time.Sleep(50 * time.Millisecond)
		}
		failovers = append(failovers, time.Since(t0))
		nodes[primary] = start(dir, primary)
	}
	sort.Slice(failovers, func(i, j int) bool { return failovers[i] < failovers[j] })
	fmt.Printf("| failover (node stopped -> first accepted push, heartbeat 200 ms, --node-timeout 1s) | median | min | max |\n|---|---:|---:|---:|\n")
	fmt.Printf("| %d kills | %s | %s | %s |\n", len(failovers), ms(compare.Median(failovers)), ms(failovers[0]), ms(failovers[len(failovers)-1]))
}

// waitSettled waits until every copy of repo is at its generation and
// returns its primary.
func waitSettled(db *store.DB, repo string) string {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		p, err := cluster.Locate(context.Background(), db, repo, time.Second)
		if err == nil {
			ok := len(p.Replicas) == 3
			for _, r := range p.Replicas {
				ok = ok && r.Healthy && r.Generation == p.Generation
			}
			if ok {
				return p.Primary
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	log.Fatal("the cluster did not settle")
	return ""
}

// ratio is b's time over a's, pair by pair.
func ratio(b, a []time.Duration) string {
	r := compare.Analyze(a, b)
	return fmt.Sprintf("%.2fx (%.2f-%.2f)", r.MedianRatio, r.CILow, r.CIHigh)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func cpus() int {
	out, _ := exec.Command("nproc").Output()
	var n int
	fmt.Sscan(string(out), &n)
	return n
}

// gitEnv runs git with an isolated HOME, as the tests' gittest does.
type gitEnv struct{ vars []string }

func newGitEnv(base string) *gitEnv {
	home := filepath.Join(base, "home")
	os.MkdirAll(home, 0o755)
	return &gitEnv{vars: []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Bench", "GIT_AUTHOR_EMAIL=bench@example.com", "GIT_COMMITTER_NAME=Bench", "GIT_COMMITTER_EMAIL=bench@example.com", "LC_ALL=C"}}
}

func (e *gitEnv) Run(dir string, extra []string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(append([]string{}, e.vars...), extra...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (e *gitEnv) Git(dir string, args ...string) string {
	out, err := e.Run(dir, nil, args...)
	if err != nil {
		log.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}
