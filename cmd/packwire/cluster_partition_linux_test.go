package main

import (
	"database/sql"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"packwire/internal/netowner"
)

// TestClusterPrimaryCutOffFromReplicasStepsDown: the primary's node is
// cut off from the other two nodes (node-to-node traffic blackholed both
// ways, PostgreSQL and clients reached by all): it can acknowledge no
// push, so the monitor moves the repository to a node on the side that
// holds a majority of the copies, within the node timeout and a few
// heartbeats, and pushes to it are acknowledged while the cut lasts
// (before, the primary kept its primacy and every push failed or waited
// for the whole cut). Once the cut heals, the old primary's copy catches
// up and every copy is equal.
func TestClusterPrimaryCutOffFromReplicasStepsDown(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short")
	}
	c := startAppCluster(t, 30*time.Second)
	names := []string{"a", "b", "c"}
	url, nodes, proxies, placement, settled, admin, env, work, pushTo := c.url, c.nodes, c.proxies, c.placement, c.settled, c.admin, c.env, c.work, c.pushTo
	primary := c.first
	env.Git(work, "commit", "-q", "--allow-empty", "-m", "one")
	if out, err := pushTo(primary); err != nil {
		t.Fatalf("first push: %v\n%s", err, out)
	}
	settled(1)

	// The cut: nothing reaches the primary's node (only nodes call it
	// there), and nothing it opens reaches the others; the others' own
	// traffic flows. Its connections are told apart by the process that
	// opened them (the node, or a git it runs).
	pids := map[int]string{}
	var roots []int
	for _, name := range names {
		pids[nodes[name].cmd.Process.Pid] = name
		roots = append(roots, nodes[name].cmd.Process.Pid)
	}
	var sources sync.Map // client conn -> node name ("" if none)
	sourceOf := func(c net.Conn) string {
		if s, ok := sources.Load(c); ok {
			return s.(string)
		}
		port := c.RemoteAddr().(*net.TCPAddr).Port
		pid := netowner.OwnerAmong(port, roots)
		for try := 0; pid == 0 && try < 3; try++ {
			pid = netowner.OwnerAmong(port, roots) // a socket between accept and /proc
		}
		name := ""
		for i := 0; pid > 1 && i < 16 && name == ""; i++ {
			name = pids[pid]
			pid = netowner.ParentPid(pid)
		}
		sources.Store(c, name)
		return name
	}
	for _, name := range names {
		if name == primary {
			proxies[name].cut()
			continue
		}
		proxies[name].cutWhere(func(c net.Conn) bool { return sourceOf(c) == primary })
	}
	cut := time.Now()
	// The node timeout is 1 s, the heartbeat 200 ms: the primary reports
	// the others unreached after a second, and a monitor moves the
	// repository at its next check. 10 s leaves room for a loaded machine.
	var moved string
	var took time.Duration
	for deadline := cut.Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if p, _, _ := placement(); p != primary {
			moved, took = p, time.Since(cut)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the primary %s, cut off from its replicas, was still the primary %s later", primary, time.Since(cut).Round(time.Millisecond))
		}
	}
	t.Logf("primary %s cut off from its replicas; %s promoted %s later", primary, moved, took.Round(time.Millisecond))
	// Pushes to the new primary are acknowledged while the cut lasts: it
	// and the third copy are a majority.
	env.Git(work, "commit", "-q", "--allow-empty", "-m", "two")
	if out, err := pushTo(moved); err != nil {
		t.Fatalf("push to the new primary %s during the cut: %v\n%s", moved, err, out)
	}
	if _, gen, _ := placement(); gen != 2 {
		t.Fatalf("generation %d after the push, want 2", gen)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var oldGen int64
	db.QueryRow("SELECT generation FROM replicas WHERE repo = 'team/app' AND node = $1", primary).Scan(&oldGen)
	if oldGen != 1 {
		t.Fatalf("the old primary's copy, cut off, is recorded at generation %d, want 1", oldGen)
	}
	// Healed: the old primary's copy catches up, every copy equal.
	for _, name := range names {
		proxies[name].cutWhere(nil)
		proxies[name].mend()
	}
	settled(2)
	if out := admin("cluster", "verify", "team/app", "--wait", "20s"); strings.Count(out, " equal") != 3 {
		t.Fatalf("cluster verify:\n%s", out)
	}
}
