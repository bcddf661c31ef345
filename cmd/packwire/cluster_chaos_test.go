package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/pgtest"
	"packwire/internal/server/cluster"
)

// nodeProc is a packwire serve process of the chaos test.
type nodeProc struct {
	name, dir         string
	cmd               *exec.Cmd
	httpAddr, gitAddr string
}

// startNode runs "packwire serve" as a node, with extra flags, and waits
// for its listeners.
func startNode(t *testing.T, name, dir, database string, extra ...string) *nodeProc {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"serve", "--data", dir, "--database", database, "--node", name,
		"--node-heartbeat", "200ms", "--node-timeout", "1s", "--git", "127.0.0.1:0", "--http", "127.0.0.1:0", "--ssh", "",
		"--maintain-interval", "0"}, extra...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.OpenFile(filepath.Join(filepath.Dir(dir), name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logFile
	t.Cleanup(func() { logFile.Close() })
	dieWithTest(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &nodeProc{name: name, dir: dir, cmd: cmd}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	ready := make(chan struct{})
	go func() {
		for sc.Scan() {
			line := sc.Text()
			if _, addr, ok := strings.Cut(line, "git://   listening on "); ok {
				n.gitAddr = addr
			}
			if _, addr, ok := strings.Cut(line, "http://  listening on "); ok {
				n.httpAddr = addr
				close(ready)
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatalf("node %s did not start", name)
	}
	return n
}

// TestClusterKillUnderLoad: 4 pushers and 8 cloners against three node
// processes while the repository's primary is killed with SIGKILL at a
// random moment. Every push whose report said ok is on every copy
// afterwards (each pusher's last acknowledged commit is in its branch on
// every node); failed pushes were told so; git fsck is clean everywhere;
// the killed node, restarted, catches up and cluster verify finds every
// copy equal. PACKWIRE_CHAOS_SECONDS sets the load's length: 20 by
// default, a kill between 5 and 15 s in (12 clients busy the whole time
// are much of the suite's CPU); 60 is the figure, and bench/chaos
// kills primaries at length.
func TestClusterKillUnderLoad(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	seconds := 20
	if s, err := strconv.Atoi(os.Getenv("PACKWIRE_CHAOS_SECONDS")); err == nil && s > 0 {
		seconds = s
	}
	url := pgtest.Shared(t).NewDatabase(t)
	base := t.TempDir()
	nodes := map[string]*nodeProc{}
	var nodesMu sync.Mutex
	for _, name := range []string{"a", "b", "c"} {
		nodes[name] = startNode(t, name, filepath.Join(base, name), url)
	}
	admin := storeAdmin(t, url, filepath.Join(t.TempDir(), "none"))
	status := func() cluster.Status {
		var st cluster.Status
		out, code := packwire(t, "cluster", "status", "--json", "--node-timeout", "1s", "--database", url, "--data", filepath.Join(base, "none"))
		if code == 0 {
			json.Unmarshal([]byte(out), &st)
		}
		return st
	}
	settled := func(within time.Duration) cluster.RepoStatus {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			for _, r := range status().Repos {
				ok := len(r.Replicas) == 3
				for _, rp := range r.Replicas {
					ok = ok && rp.Generation == r.Generation && rp.Healthy
				}
				if ok {
					return r
				}
			}
			if time.Now().After(deadline) {
				for _, name := range []string{"a", "b", "c"} {
					b, _ := os.ReadFile(filepath.Join(base, name+".log"))
					t.Logf("node %s's log:\n%s", name, cluster.LastLines(string(b), 20))
				}
				t.Fatalf("the cluster did not settle: %+v", status())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	admin("repo", "create", "app")
	admin("user", "add", "ci")
	admin("grant", "ci", "write", "**")
	lines := strings.Split(strings.TrimSpace(admin("token", "create", "ci")), "\n")
	token := lines[len(lines)-1]
	primary := settled(15 * time.Second).Primary
	env := gittest.New(t)
	// Clients pick a live node, as a load balancer with health checks
	// would: hammering a killed node's port from the same ephemeral range
	// eventually makes a TCP connection to itself, and that client hangs.
	dead := ""
	pick := func() *nodeProc {
		nodesMu.Lock()
		defer nodesMu.Unlock()
		var names []string
		for _, n := range []string{"a", "b", "c"} {
			if n != dead {
				names = append(names, n)
			}
		}
		return nodes[names[rand.IntN(len(names))]]
	}

	ctx, stop := context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second)
	defer stop()
	var wg sync.WaitGroup
	acked := make([]string, 4) // each pusher's last acknowledged commit
	var pushesOK, pushesFailed, clonesOK, clonesFailed atomic.Int64
	var unexplained, reasons sync.Map
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work := filepath.Join(base, fmt.Sprintf("pusher%d", i))
			env.Git("", "init", "-q", "-b", "main", work)
			for n := 0; ctx.Err() == nil; n++ {
				os.WriteFile(filepath.Join(work, "f"), []byte(fmt.Sprintf("%d %d\n", i, n)), 0o644)
				env.Git(work, "add", ".")
				env.Git(work, "commit", "-qm", fmt.Sprintf("pusher %d push %d", i, n))
				head := env.RevParse(work, "HEAD")
				node := pick()
				out, err := env.Run(work, nil, "push", "--porcelain", fmt.Sprintf("http://ci:%s@%s/app", token, node.httpAddr), fmt.Sprintf("HEAD:refs/heads/p%d", i))
				if err == nil {
					pushesOK.Add(1)
					acked[i] = head
					continue
				}
				pushesFailed.Add(1)
				reasons.Store(cluster.LastLines(out, 4), true)
				// A push to the node that was killed under it: its next
				// request may reach whatever listens on that port now (the
				// port of a dead process goes to the next listener on
				// 127.0.0.1:0, another test's server when packages run
				// alongside, which answered "Authentication failed": the
				// flake seen in 2 of ~11 runs and in a -count=3 soak).
				nodesMu.Lock()
				killed := dead != "" && nodes[dead] == node
				nodesMu.Unlock()
				if killed {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				// Told so: a rejection with its reason, or the connection to
				// a killed node refused.
				if !strings.Contains(out, "[remote rejected]") && !strings.Contains(out, "Failed to connect") &&
					!strings.Contains(out, "Could not read from remote") && !strings.Contains(out, "RPC failed") &&
					!strings.Contains(out, "unable to access") && !strings.Contains(out, "rejected") {
					unexplained.Store(out, true)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				node := pick()
				url := fmt.Sprintf("git://%s/app", node.gitAddr)
				if n%2 == 1 {
					url = fmt.Sprintf("http://%s/app", node.httpAddr)
				}
				dir := filepath.Join(base, fmt.Sprintf("clone%d-%d", i, n))
				if _, err := env.Run("", nil, "clone", "-q", "--bare", url, dir); err != nil {
					clonesFailed.Add(1)
				} else {
					clonesOK.Add(1)
				}
				os.RemoveAll(dir)
			}
		}()
	}
	// SIGKILL the primary at a random moment of the middle half.
	killAt := time.Duration(seconds) * time.Second * time.Duration(25+rand.IntN(50)) / 100
	select {
	case <-time.After(killAt):
	case <-ctx.Done():
	}
	nodesMu.Lock()
	victim := nodes[primary]
	dead = primary
	victim.cmd.Process.Signal(syscall.SIGKILL)
	victim.cmd.Wait()
	nodesMu.Unlock()
	t.Logf("killed the primary %s after %s", primary, killAt.Round(time.Millisecond))
	wg.Wait()
	t.Logf("pushes: %d acknowledged, %d failed; clones: %d ok, %d failed", pushesOK.Load(), pushesFailed.Load(), clonesOK.Load(), clonesFailed.Load())
	reasons.Range(func(k, _ any) bool {
		t.Logf("a push failed with: %s", k)
		return true
	})
	failed := false
	unexplained.Range(func(k, _ any) bool {
		t.Errorf("a failed push was not told why:\n%s", k)
		failed = true
		return true
	})
	if failed {
		// What the nodes refused, and why, for the failure's diagnosis.
		nodesMu.Lock()
		for name, n := range nodes {
			b, _ := os.ReadFile(filepath.Join(filepath.Dir(n.dir), name+".log"))
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "msg=refused") || strings.Contains(line, "level=ERROR") {
					t.Logf("node %s: %s", name, line)
				}
			}
		}
		nodesMu.Unlock()
	}
	if pushesOK.Load() == 0 || clonesOK.Load() == 0 {
		t.Fatal("the load did nothing")
	}

	// The killed node comes back and catches up; every copy is equal.
	nodesMu.Lock()
	nodes[primary] = startNode(t, primary, victim.dir, url)
	dead = ""
	nodesMu.Unlock()
	settled(30 * time.Second)
	if out := admin("cluster", "verify", "app"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify:\n%s", out)
	}
	for name, n := range nodes {
		bare := filepath.Join(n.dir, "repos", "app.git")
		env.Git(bare, "fsck", "--strict")
		for i, commit := range acked {
			if commit == "" {
				continue
			}
			if _, err := env.Run(bare, nil, "merge-base", "--is-ancestor", commit, fmt.Sprintf("refs/heads/p%d", i)); err != nil {
				t.Errorf("node %s: pusher %d's acknowledged %s is not in refs/heads/p%d", name, i, commit[:12], i)
			}
		}
	}
}
