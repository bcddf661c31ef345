package route

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"packwire/internal/gittest"
	"packwire/internal/repo"
	"packwire/internal/server/cluster"
)

// TestCatchUpGivesUpOnASourceThatStopsAnswering: a catch-up reading from
// a copy whose node accepts the connection and then says nothing (paused,
// or cut off mid-read) gives the read up once the node is found not
// answering, rather than holding this copy's ref writes, and so every
// replication to it, until the node comes back (bench/chaos
// pause-primary: a new primary's pushes waited for the vote of a copy
// whose catch-up was fetching from the paused old primary).
func TestCatchUpGivesUpOnASourceThatStopsAnswering(t *testing.T) {
	env := gittest.New(t)
	t.Setenv("HOME", env.Home)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, silent, until the test ends
		}
	}()
	root := repo.Root{Dir: t.TempDir()}
	r, err := root.Create(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	// The source's node answers the first checks, then is found gone.
	var checks atomic.Int32
	rt := &Router{Node: &cluster.Node{Name: "c"}, Secret: testSecret, sourceCheck: func(ctx context.Context, repo, node string, health bool) error {
		if checks.Add(1) < 3 {
			return nil
		}
		return fmt.Errorf("node %s has not answered this node's pings for 3s", node)
	}}
	silent := cluster.Replica{Node: "b", URL: "http://" + ln.Addr().String(), Healthy: true, Generation: 4}
	pl := cluster.Placement{Repo: "app", Primary: "b", Generation: 4, Digest: strings.Repeat("d", 64), Replicas: []cluster.Replica{silent}}
	// A safety net only: the give-up comes within a second.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	start := time.Now()
	_, err = rt.fetchFrom(ctx, r, pl, silent)
	if !errors.Is(err, errSourceLost) {
		t.Fatalf("fetch from a silent source ended after %v with %v, want it given up on (errSourceLost)", time.Since(start), err)
	}
	checks.Store(0)
	start = time.Now()
	_, err = rt.catchUpSource(ctx, pl)
	t.Logf("given up after %v: %v", time.Since(start), err)
	if !errors.Is(err, errNoSource) || !strings.Contains(err.Error(), errSourceLost.Error()) {
		t.Fatalf("choosing a silent source ended after %v with %v, want no source, the silent one given up on", time.Since(start), err)
	}
}
