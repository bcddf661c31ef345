package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestPeerReach: a peer is unreached once it has not answered for a node
// timeout (a new one gets that long first), reached again at its next
// answer; after a gap in this node's own asking longer than a timeout (it
// was paused, or could not heartbeat) nothing is reported until the
// peers have had a timeout to answer again. lost (Node.Unreached, which
// relays check) says the same of one peer.
func TestPeerReach(t *testing.T) {
	const timeout = 3 * time.Second
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	down := map[string]bool{}
	r := &peerReach{clock: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }}
	ask := func(_ context.Context, url string) error {
		mu.Lock()
		defer mu.Unlock()
		if down[url] {
			return errors.New("no answer")
		}
		return nil
	}
	peers := []peer{{"b", "b"}, {"c", "c"}}
	// round advances the clock by d, asks, and waits for the answers.
	round := func(d time.Duration) {
		t.Helper()
		mu.Lock()
		now = now.Add(d)
		mu.Unlock()
		r.probe(context.Background(), peers, timeout, ask)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			r.mu.Lock()
			busy := r.asking["b"] || r.asking["c"]
			r.mu.Unlock()
			if !busy {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the answers never came")
			}
		}
	}
	round(0)
	if got := r.unreached(timeout); got != "" {
		t.Fatalf("unreached at the start: %q", got)
	}
	mu.Lock()
	down["c"] = true
	mu.Unlock()
	for i := 0; i < 3; i++ {
		round(time.Second)
	}
	if got := r.unreached(timeout); got != "" {
		t.Fatalf("unreached after 3 s without c: %q, want none yet", got)
	}
	round(time.Second)
	if got := r.unreached(timeout); got != ",c," {
		t.Fatalf("unreached after 4 s without c: %q, want ,c,", got)
	}
	if !r.lost("c", timeout) || r.lost("b", timeout) || r.lost("d", timeout) {
		t.Fatalf("lost after 4 s without c: c %v, b %v, d (never listed) %v; want only c", r.lost("c", timeout), r.lost("b", timeout), r.lost("d", timeout))
	}
	// This node stops for 10 s: nothing is known until the peers had a
	// timeout to answer again.
	mu.Lock()
	now = now.Add(10 * time.Second)
	mu.Unlock()
	if got := r.unreached(timeout); got != "" {
		t.Fatalf("unreached after a 10 s gap in asking: %q, want none", got)
	}
	if r.lost("c", timeout) {
		t.Fatal("c lost after a 10 s gap in asking, want not known")
	}
	round(time.Second)
	if got := r.unreached(timeout); got != "" {
		t.Fatalf("unreached right after the gap: %q, want none", got)
	}
	for i := 0; i < 4; i++ {
		round(time.Second)
	}
	if got := r.unreached(timeout); got != ",c," {
		t.Fatalf("unreached 4 s after the gap: %q, want ,c,", got)
	}
	mu.Lock()
	down["c"] = false
	mu.Unlock()
	round(time.Second)
	if got := r.unreached(timeout); got != "" {
		t.Fatalf("unreached once c answers again: %q", got)
	}
	if r.lost("c", timeout) {
		t.Fatal("c lost once it answers again")
	}
}
