//go:build linux

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"packwire/internal/server/cluster"
)

// verdict is what the checker found in one phase.
type verdict struct {
	lost   []string      // acknowledged pushes missing from a copy at the end
	stale  []string      // reads that missed a push acknowledged before they started
	copies []string      // fsck errors, copies not equal, copies not settled
	window time.Duration // the longest with no push acknowledged to any repository
	// repoWindow is the longest one repository took no push (a wedged
	// repository hides behind the other's pushes in window).
	repoWindow time.Duration
	stuck      []string        // repositories that took no push for longer than the phase allows
	failover   []time.Duration // per event hitting the primary: to the first push a new primary acknowledged (-1: none)
	promoted   []time.Duration // per event hitting the primary: to PostgreSQL recording another primary (-1: none)
	recovery   []time.Duration // per event: to the first acknowledged push after it (-1: none)
}

func (v verdict) failed() bool { return len(v.lost)+len(v.stale)+len(v.copies)+len(v.stuck) > 0 }

// check reads every node's copy of each repository directly (git
// for-each-ref and git fsck in its bare repository) and the history:
// no acknowledged push missing, no stale read, copies clean and equal,
// and (maxWindow > 0) no repository without an acknowledged push for
// longer than maxWindow.
func check(ctx context.Context, c *testCluster, h *history, repos []string, settleErr error, from, to time.Time, primaryNemesis bool, maxWindow time.Duration) verdict {
	var v verdict
	if settleErr != nil {
		v.copies = append(v.copies, settleErr.Error())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, repo := range repos {
		chain := indexOf(h.chains[repo])
		recorded := "unknown"
		if p, err := c.placement(ctx, repo); err == nil {
			recorded = fmt.Sprintf("generation %d:", p.Generation)
			for _, r := range p.Replicas {
				recorded += fmt.Sprintf(" %s at %d", r.Node, r.Generation)
			}
		}
		var first map[string]string
		for _, n := range c.nodes {
			bare := filepath.Join(n.dir, "repos", repo+".git")
			out, err := c.git.output(ctx, time.Minute, bare, "for-each-ref", "--format=%(objectname)\t%(refname)")
			var refs map[string]string
			if err == nil {
				refs, err = parseRefs(out)
			}
			if err != nil {
				v.copies = append(v.copies, fmt.Sprintf("%s on %s: for-each-ref: %v %s", repo, n.name, err, lastLines(out, 2)))
				continue
			}
			for ref := range refs {
				if strings.HasPrefix(ref, cluster.LocalRefs) {
					delete(refs, ref)
				}
			}
			if out, err := c.git.run(ctx, 5*time.Minute, bare, "fsck", "--no-progress"); err != nil {
				v.copies = append(v.copies, fmt.Sprintf("%s on %s: git fsck: %v %s", repo, n.name, err, lastLines(out, 3)))
			}
			for _, p := range h.pushes {
				if p.repo == repo && p.acked && !holds(refs, p, chain) {
					v.lost = append(v.lost, fmt.Sprintf("%s on %s: %s %s (acknowledged %s by %s via %s over %s) is %s",
						repo, n.name, p.ref, short(p.commit), p.end.Format("15:04:05.000"), orUnknown(p.primaryAfter), p.node, p.transport, describe(refs[p.ref], chain)))
				}
			}
			if first == nil {
				first = refs
			} else if d := diff(first, refs, chain); d != "" {
				v.copies = append(v.copies, fmt.Sprintf("%s: %s's refs differ from %s's (there): %s; the cluster records %s", repo, n.name, c.nodes[0].name, d, recorded))
			}
		}
		// Stale reads: a successful read missing a push acknowledged
		// before the read started.
		for _, r := range h.reads {
			if r.repo != repo || !r.ok {
				continue
			}
			for _, p := range h.pushes {
				if p.repo == repo && p.acked && p.end.Before(r.start) && !holds(r.refs, p, chain) {
					v.stale = append(v.stale, fmt.Sprintf("%s from %s over %s at %s (recorded %s): %s %s acknowledged %s before is %s",
						repo, r.node, r.transport, r.start.Format("15:04:05.000"), r.recorded, p.ref, short(p.commit),
						r.start.Sub(p.end).Round(time.Millisecond), describe(r.refs[p.ref], chain)))
					break // one line a read
				}
			}
		}
	}
	v.window, _ = longestGap(h.pushes, from, to)
	for _, repo := range repos {
		var mine []pushRecord
		for _, p := range h.pushes {
			if p.repo == repo {
				mine = append(mine, p)
			}
		}
		gap, at := longestGap(mine, from, to)
		v.repoWindow = max(v.repoWindow, gap)
		if maxWindow > 0 && gap > maxWindow {
			v.stuck = append(v.stuck, fmt.Sprintf("%s took no push for %s from %s (longer than -max-window %s)",
				repo, gap.Round(100*time.Millisecond), at.Format("15:04:05.000"), maxWindow))
		}
	}
	for i, e := range h.events {
		until := to
		if i+1 < len(h.events) {
			until = h.events[i+1].at
		}
		v.recovery = append(v.recovery, firstAck(h.pushes, e.at, until, func(pushRecord) bool { return true }))
		if primaryNemesis {
			v.promoted = append(v.promoted, firstMove(h.primaries, e.at, until, e.primary))
			v.failover = append(v.failover, firstAck(h.pushes, e.at, until, func(p pushRecord) bool {
				return p.repo == repos[0] && p.primaryAfter != "" && p.primaryAfter != e.primary
			}))
		}
	}
	return v
}

// holds tells whether refs hold push p: its branch at its commit, or (a
// fast-forwarded branch) at it or a later commit of the same chain.
func holds(refs map[string]string, p pushRecord, chain map[string]int) bool {
	got, ok := refs[p.ref]
	if !ok {
		return false
	}
	if p.kind == branchPerPush {
		return got == p.commit
	}
	i, ok := chain[got]
	return ok && i >= p.index
}

func describe(got string, chain map[string]int) string {
	if got == "" {
		return "missing"
	}
	if i, ok := chain[got]; ok {
		return fmt.Sprintf("at %s (push %d of its chain)", short(got), i)
	}
	return "at " + short(got)
}

// orUnknown names a primary the suite could not read (PostgreSQL away).
func orUnknown(primary string) string {
	if primary == "" {
		return "a primary not read (PostgreSQL away)"
	}
	return primary
}

func indexOf(chain []string) map[string]int {
	m := map[string]int{}
	for i, c := range chain {
		m[c] = i
	}
	return m
}

func short(oid string) string {
	if len(oid) > 10 {
		return oid[:10]
	}
	return oid
}

// diff names refs that differ between a and b (at most 5).
func diff(a, b map[string]string, chain map[string]int) string {
	var d []string
	for ref, oid := range a {
		if b[ref] != oid {
			d = append(d, fmt.Sprintf("%s %s there, %s here", ref, describe(oid, chain), describe(b[ref], chain)))
		}
	}
	for ref, oid := range b {
		if _, ok := a[ref]; !ok {
			d = append(d, fmt.Sprintf("%s missing there, %s here", ref, describe(oid, chain)))
		}
	}
	sort.Strings(d)
	if len(d) > 5 {
		d = append(d[:5], fmt.Sprintf("and %d more", len(d)-5))
	}
	return strings.Join(d, ", ")
}

// longestGap is the longest time in [from, to] with no push acknowledged,
// and when it began.
func longestGap(pushes []pushRecord, from, to time.Time) (time.Duration, time.Time) {
	var acks []time.Time
	for _, p := range pushes {
		if p.acked && !p.end.Before(from) && !p.end.After(to) {
			acks = append(acks, p.end)
		}
	}
	sort.Slice(acks, func(i, j int) bool { return acks[i].Before(acks[j]) })
	longest, at, prev := time.Duration(0), from, from
	for _, t := range append(acks, to) {
		if d := t.Sub(prev); d > longest {
			longest, at = d, prev
		}
		prev = t
	}
	return longest, at
}

// firstMove is the time from at to the first time (before until) the
// watched repository's primary was seen to be another node than old; -1
// if none. The poll's period (50 ms) bounds its error.
func firstMove(seen []primarySeen, at, until time.Time, old string) time.Duration {
	for _, s := range seen {
		if s.at.After(at) && s.at.Before(until) && s.primary != "" && s.primary != old {
			return s.at.Sub(at)
		}
	}
	return -1
}

// firstAck is the time from at to the first push acknowledged after it
// (before until) that match accepts; -1 if none.
func firstAck(pushes []pushRecord, at, until time.Time, match func(pushRecord) bool) time.Duration {
	best := time.Duration(-1)
	for _, p := range pushes {
		if p.acked && p.end.After(at) && p.end.Before(until) && match(p) {
			if d := p.end.Sub(at); best < 0 || d < best {
				best = d
			}
		}
	}
	return best
}
