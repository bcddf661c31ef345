package cluster

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"
)

// peerReach is what a node knows of its peers' reachability over the
// network it replicates on: each heartbeat it asks every other node
// (Node.Reach, one request at a time per peer, bounded by the node
// timeout), and a peer that has not answered for a node timeout is
// unreached. PostgreSQL sees only that a node heartbeats; this is how the
// monitor learns that a primary alive in PostgreSQL is cut off from its
// replicas (a partition), and moves its repositories to a side that
// holds a majority of their copies (Failover).
//
// Times here are this node's own clock: only its own are compared.
type peerReach struct {
	mu       sync.Mutex
	answered map[string]time.Time // peer -> its last answer (or when first seen)
	asking   map[string]bool      // a request to the peer is under way
	// round is when the heartbeat last asked. A longer gap than a node
	// timeout (this node paused, or PostgreSQL away so no heartbeat ran)
	// says nothing of the peers: their clocks restart.
	round time.Time
	clock func() time.Time // nil: time.Now (tests set it)
}

func (r *peerReach) now() time.Time {
	if r.clock != nil {
		return r.clock()
	}
	return time.Now()
}

// peer is another node as the heartbeat lists it.
type peer struct{ name, url string }

// probe asks each of peers whether it answers, in the background: a
// request still under way from a previous heartbeat is not doubled.
// Peers gone from the list are forgotten.
func (r *peerReach) probe(ctx context.Context, peers []peer, timeout time.Duration, ask func(ctx context.Context, url string) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered == nil {
		r.answered, r.asking = map[string]time.Time{}, map[string]bool{}
	}
	now := r.now()
	if gap := now.Sub(r.round); gap > timeout {
		for name := range r.answered {
			r.answered[name] = now
		}
	}
	r.round = now
	listed := map[string]bool{}
	for _, p := range peers {
		listed[p.name] = true
		if _, ok := r.answered[p.name]; !ok {
			r.answered[p.name] = now // a new peer gets a node timeout to answer
		}
		if r.asking[p.name] {
			continue
		}
		r.asking[p.name] = true
		go func() {
			actx, cancel := context.WithTimeout(ctx, timeout)
			err := ask(actx, p.url)
			cancel()
			r.mu.Lock()
			defer r.mu.Unlock()
			r.asking[p.name] = false
			if err == nil {
				r.answered[p.name] = r.now()
			}
		}()
	}
	for name := range r.answered {
		if !listed[name] && !r.asking[name] {
			delete(r.answered, name)
			delete(r.asking, name)
		}
	}
}

// lost tells whether peer has not answered for timeout (and was asked
// lately: see round).
func (r *peerReach) lost(peer string, timeout time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	at, ok := r.answered[peer]
	return ok && now.Sub(r.round) <= timeout && now.Sub(at) > timeout
}

// unreached lists the peers that have not answered for timeout, as the
// nodes table holds them: ",b,c," ("" for none).
func (r *peerReach) unreached(timeout time.Duration) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.round) > timeout {
		return "" // not asked lately (see round)
	}
	var names []string
	for name, at := range r.answered {
		if now.Sub(at) > timeout {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(names)
	return "," + strings.Join(names, ",") + ","
}
