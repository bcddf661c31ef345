//go:build linux

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// A nemesis injects one kind of fault into the cluster in cycles until
// its duration is over (at least one cycle): the fault, held for hold,
// then healed, then rest before the next. Every injection is an event of
// the history (the failover time is measured from it).
type nemesis struct {
	name  string
	about string
	// primary: the fault hits the repository's primary, so a failover is
	// expected (or, for a partition, refused pushes until it heals).
	primary bool
	// hold and rest in a long run, and in a -short one, which runs
	// shortCycles cycles (0: one).
	hold, rest, shortHold, shortRest time.Duration
	shortCycles                      int
	inject                           func(ctx context.Context, f *fault) error
}

// event is one injection.
type event struct {
	at      time.Time
	what    string
	node    string // the node hit ("" for PostgreSQL)
	primary string // the repository's primary just before
	healed  time.Time
}

// fault is what a nemesis acts on in one cycle.
type fault struct {
	c       *testCluster
	h       *history
	repo    string        // the repository whose primary is the target
	primary string        // its primary at the cycle's start
	hold    time.Duration // how long the fault lasts
}

// nemeses are every nemesis, in the order they run.
var nemeses = []nemesis{
	{name: "kill-primary", about: "kill -9 of the primary's node (its process group), restarted after the hold", primary: true,
		hold: 10 * time.Second, rest: 10 * time.Second, shortHold: 4 * time.Second, shortRest: 2 * time.Second,
		inject: func(ctx context.Context, f *fault) error {
			return f.killHold(ctx, f.c.byName(f.primary))
		}},
	{name: "kill-replica", about: "kill -9 of a replica's node, restarted after the hold",
		hold: 10 * time.Second, rest: 10 * time.Second, shortHold: 4 * time.Second, shortRest: 2 * time.Second,
		inject: func(ctx context.Context, f *fault) error {
			return f.killHold(ctx, f.replica())
		}},
	{name: "pause-primary", about: "SIGSTOP of the primary's node for the hold, then SIGCONT", primary: true,
		hold: 15 * time.Second, rest: 10 * time.Second, shortHold: 5 * time.Second, shortRest: 2 * time.Second,
		inject: func(ctx context.Context, f *fault) error {
			f.pauseHold(ctx, f.c.byName(f.primary), "SIGSTOP")
			return nil
		}},
	{name: "pause-primary-mid-push", about: "SIGSTOP of the primary's node while a push is in flight, for the hold", primary: true,
		hold: 15 * time.Second, rest: 10 * time.Second, shortHold: 5 * time.Second, shortRest: 2 * time.Second,
		inject: func(ctx context.Context, f *fault) error {
			n := f.c.byName(f.primary)
			// A push under way for a random 20-120 ms: inside its replication
			// or its transaction, most of the time.
			deadline := time.Now().Add(10 * time.Second)
			for f.h.inFlight.Load() == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
				time.Sleep(2 * time.Millisecond)
			}
			time.Sleep(time.Duration(20+rand.IntN(100)) * time.Millisecond)
			f.pauseHold(ctx, n, fmt.Sprintf("SIGSTOP with %d pushes in flight", f.h.inFlight.Load()))
			return nil
		}},
	{name: "pause-replica", about: "SIGSTOP of one replica's node 0.7 s every 3 s (it keeps catching up)",
		hold: 700 * time.Millisecond, rest: 2300 * time.Millisecond, shortHold: 700 * time.Millisecond, shortRest: 1300 * time.Millisecond, shortCycles: 3,
		inject: func(ctx context.Context, f *fault) error {
			f.pauseHold(ctx, f.replica(), "SIGSTOP")
			return nil
		}},
	{name: "pg-restart", about: "PostgreSQL fast restart (connections cut)",
		rest: 10 * time.Second, shortRest: 3 * time.Second, shortCycles: 2,
		inject: func(ctx context.Context, f *fault) error {
			return f.pgBounce("PostgreSQL fast restart", f.c.pgHalt)
		}},
	{name: "pg-kill", about: "PostgreSQL SIGKILL (every backend), started again at once (crash recovery)",
		rest: 10 * time.Second, shortRest: 3 * time.Second, shortCycles: 2,
		inject: func(ctx context.Context, f *fault) error {
			return f.pgBounce("PostgreSQL SIGKILL", f.c.pgKill)
		}},
	{name: "pg-down", about: "PostgreSQL stopped for the hold (20 s), then started",
		hold: 20 * time.Second, rest: 10 * time.Second, shortHold: 5 * time.Second, shortRest: 3 * time.Second,
		inject: func(ctx context.Context, f *fault) error {
			f.event("PostgreSQL stopped", "")
			f.c.pgHalt()
			sleep(ctx, f.hold)
			return f.c.pgResume()
		}},
	{name: "pg-blackhole", about: "the primary's PostgreSQL connections blackholed (bytes stop, nothing closed) for the hold", primary: true,
		hold: 30 * time.Second, rest: 10 * time.Second, shortHold: 5 * time.Second, shortRest: 3 * time.Second,
		inject: func(ctx context.Context, f *fault) error {
			n := f.c.byName(f.primary)
			f.event("PostgreSQL blackholed", n.name)
			n.pgProxy.setCut(func(string) bool { return true })
			sleep(ctx, f.hold)
			n.pgProxy.setCut(nil)
			return nil
		}},
	{name: "partition", about: "node-to-node traffic between the primary and the replicas blackholed both ways for the hold (each keeps PostgreSQL and its clients)", primary: true,
		hold: 20 * time.Second, rest: 10 * time.Second, shortHold: 5 * time.Second, shortRest: 3 * time.Second,
		inject: func(ctx context.Context, f *fault) error {
			p := f.primary
			f.event("partitioned from the replicas", p)
			for _, n := range f.c.nodes {
				to := n.name
				// A connection crosses the cut when exactly one end is the primary.
				n.peerProxy.setCut(func(from string) bool { return from != "" && (from == p) != (to == p) })
			}
			sleep(ctx, f.hold)
			for _, n := range f.c.nodes {
				n.peerProxy.setCut(nil)
			}
			return nil
		}},
}

// killHold kills n, and starts it again after the hold.
func (f *fault) killHold(ctx context.Context, n *node) error {
	f.event("SIGKILL", n.name)
	f.c.kill(n)
	sleep(ctx, f.hold)
	return f.c.start(n)
}

// pauseHold stops n for the hold.
func (f *fault) pauseHold(ctx context.Context, n *node, what string) {
	f.event(what, n.name)
	f.c.pause(n)
	sleep(ctx, f.hold)
	f.c.resume(n)
}

// pgBounce stops PostgreSQL with stop and starts it again at once.
func (f *fault) pgBounce(what string, stop func()) error {
	f.event(what, "")
	stop()
	return f.c.pgResume()
}

// event records an injection now.
func (f *fault) event(what, node string) {
	f.h.addEvent(event{at: time.Now(), what: what, node: node, primary: f.primary})
}

// replica is a node holding a copy that is not the primary (the first in
// name order, so a phase hits the same one each cycle).
func (f *fault) replica() *node {
	for _, n := range f.c.nodes {
		if n.name != f.primary {
			return n
		}
	}
	return f.c.nodes[0]
}

// cycles runs nm for duration (in a -short run, its shortCycles), each
// cycle against the repository's primary at its start; the cluster is
// healed after each, and rests before the next.
func (nm nemesis) cycles(ctx context.Context, c *testCluster, h *history, repo string, duration time.Duration, short bool) error {
	hold, rest := nm.hold, nm.rest
	if short {
		hold, rest = nm.shortHold, nm.shortRest
	}
	start := time.Now()
	for n := 1; ; n++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		f := &fault{c: c, h: h, repo: repo, hold: hold}
		if p, err := c.placement(ctx, repo); err == nil {
			f.primary = p.Primary
		}
		if f.primary == "" {
			f.primary = c.nodes[0].name
		}
		err := nm.inject(ctx, f)
		if herr := c.heal(); err == nil {
			err = herr
		}
		h.mu.Lock()
		if len(h.events) > 0 {
			h.events[len(h.events)-1].healed = time.Now()
		}
		h.mu.Unlock()
		if err != nil {
			return err
		}
		if short && n >= max(nm.shortCycles, 1) || !short && time.Since(start) >= duration {
			return nil
		}
		sleep(ctx, rest)
	}
}

// sleep waits d or until ctx ends: the length of a fault, not a wait for
// something to happen.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
