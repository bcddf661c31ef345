//go:build linux

package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"time"
)

// phaseResult is one nemesis's run and what the checker found.
type phaseResult struct {
	nm                         nemesis
	repos                      []string
	events                     []event
	pushesAcked, pushesFailed  int
	readsOK, readsFailed       int
	readsByTransport           map[string]int
	failReasons                map[string]int // a failed push's last words -> how many
	records                    []string       // a failed phase's records and copies at the end (testCluster.dump)
	v                          verdict
	err                        error // the phase could not run to its end
	nemesisTime, workloadSpell time.Duration
}

func (r phaseResult) failed() bool { return r.err != nil || r.v.failed() }

// summarize counts a phase's history.
func summarize(r *phaseResult, h *history) {
	r.readsByTransport = map[string]int{}
	r.failReasons = map[string]int{}
	for _, p := range h.pushes {
		if p.acked {
			r.pushesAcked++
		} else {
			r.pushesFailed++
			r.failReasons[p.out]++
		}
	}
	for _, rd := range h.reads {
		if rd.ok {
			r.readsOK++
			r.readsByTransport[rd.transport]++
		} else {
			r.readsFailed++
		}
	}
	r.events = h.events
}

// reportHeader describes the run: when, where, what code, which settings.
func reportHeader(w io.Writer, root string, o options) {
	rev, _ := exec.Command("git", "-C", root, "log", "-1", "--format=%h %s").Output()
	dirty, _ := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output()
	gitVersion, _ := exec.Command("git", "version").Output()
	mode := fmt.Sprintf("%s per nemesis", o.duration)
	if o.short {
		mode = "-short (one or a few short cycles per nemesis)"
	}
	fmt.Fprintf(w, "# packwire nemesis suite\n\n")
	fmt.Fprintf(w, "- Date: %s; %d CPUs (%s/%s); %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, strings.TrimSpace(string(gitVersion)))
	code := strings.TrimSpace(string(rev))
	if len(dirty) > 0 {
		code += " (with uncommitted changes)"
	}
	fmt.Fprintf(w, "- Code: %s\n", code)
	fmt.Fprintf(w, "- Cluster: 3 `packwire serve` processes (replicas 3) on one PostgreSQL, 127.0.0.1; --node-heartbeat %s, --node-timeout %s; each node reaches PostgreSQL and is reached by its peers through proxies the suite cuts\n", o.heartbeat, o.nodeTimeout)
	stall := fmt.Sprintf("a push that shows no progress for %s is cut and the next goes to the next node, as a client behind a load balancer would", o.stall)
	if o.stall <= 0 {
		stall = "a push waits for its node as long as it takes (1 minute at most)"
	}
	fmt.Fprintf(w, "- Workload per nemesis: 2 new repositories; per repository a pusher making a new branch each push and one fast-forwarding a branch (HTTP and SSH in turn, to every live node; %s); %d readers (HTTP, SSH, git://) listing refs (every fifth a mirror clone) from every live node\n", stall, o.readers)
	fmt.Fprintf(w, "- Failover, for a fault of the primary: from the fault to PostgreSQL recording another primary for the first repository (polled every 50 ms), and to the first push to it acknowledged by a new primary\n")
	fmt.Fprintf(w, "- Mode: %s\n\n", mode)
}

// reportTable is one line per nemesis, then the details of each.
func reportTable(w io.Writer, results []phaseResult) {
	fmt.Fprintf(w, "| nemesis | faults | pushes acked / failed | reads ok / failed | lost | stale reads | copies | longest window without an ack | longest a repository took no push | failover: another primary recorded | failover: a push acked by a new primary | first ack after a fault | verdict |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|---|---|\n")
	for _, r := range results {
		copies := "fsck clean, equal"
		if len(r.v.copies) > 0 {
			copies = fmt.Sprintf("**%d problems**", len(r.v.copies))
		}
		promoted, failover := "n/a", "n/a"
		if r.nm.primary {
			promoted, failover = spread(r.v.promoted), spread(r.v.failover)
		}
		verdict := "ok"
		switch {
		case r.err != nil:
			verdict = "**did not run to its end**"
		case r.v.failed():
			verdict = "**FAIL**"
		}
		repoWindow := secs(r.v.repoWindow)
		if len(r.v.stuck) > 0 {
			repoWindow = "**" + repoWindow + "**"
		}
		fmt.Fprintf(w, "| %s | %d | %d / %d | %d / %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.nm.name, len(r.events), r.pushesAcked, r.pushesFailed, r.readsOK, r.readsFailed,
			count(len(r.v.lost)), count(len(r.v.stale)), copies, secs(r.v.window), repoWindow, promoted, failover, spread(r.v.recovery), verdict)
	}
	fmt.Fprintln(w)
	for _, r := range results {
		fmt.Fprintf(w, "### %s\n\n%s. Repositories %s.\n\n", r.nm.name, r.nm.about, strings.Join(r.repos, ", "))
		if r.err != nil {
			fmt.Fprintf(w, "- Stopped early: %v\n", r.err)
		}
		for _, e := range r.events {
			who := e.node
			if who == "" {
				who = "PostgreSQL"
			}
			fmt.Fprintf(w, "- %s %s: %s (primary was %s), healed after %s\n", e.at.Format("15:04:05.000"), who, e.what, e.primary, secs(e.healed.Sub(e.at)))
		}
		if len(r.readsByTransport) > 0 {
			fmt.Fprintf(w, "- Successful reads by transport: HTTP %d, SSH %d, git:// %d\n", r.readsByTransport[overHTTP], r.readsByTransport[overSSH], r.readsByTransport[overGit])
		}
		list(w, fmt.Sprintf("Lost (acknowledged, missing from a copy at the end): %d", len(r.v.lost)), r.v.lost)
		list(w, fmt.Sprintf("Stale reads (missed a push acknowledged before the read started): %d", len(r.v.stale)), r.v.stale)
		list(w, fmt.Sprintf("Copies: %d", len(r.v.copies)), r.v.copies)
		list(w, fmt.Sprintf("Stuck (no push acknowledged for longer than -max-window): %d", len(r.v.stuck)), r.v.stuck)
		list(w, "Recorded in PostgreSQL at the end, and each copy's refs digest", r.records)
		if len(r.failReasons) > 0 {
			var reasons []string
			for k, n := range r.failReasons {
				reasons = append(reasons, fmt.Sprintf("%dx %s", n, k))
			}
			sort.Slice(reasons, func(i, j int) bool { return leadingCount(reasons[i]) > leadingCount(reasons[j]) })
			list(w, fmt.Sprintf("Failed pushes: %d, with %d distinct last words of the client", r.pushesFailed, len(reasons)), reasons)
		}
		fmt.Fprintln(w)
	}
}

func list(w io.Writer, title string, items []string) {
	if len(items) == 0 {
		return
	}
	fmt.Fprintf(w, "- %s\n", title)
	for i, it := range items {
		if i == 10 {
			fmt.Fprintf(w, "  - and %d more\n", len(items)-10)
			break
		}
		fmt.Fprintf(w, "  - %s\n", strings.ReplaceAll(it, "|", "/"))
	}
}

func leadingCount(s string) int {
	var n int
	fmt.Sscanf(s, "%dx", &n)
	return n
}

func count(n int) string {
	if n == 0 {
		return "0"
	}
	return fmt.Sprintf("**%d**", n)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// spread shows per-fault times: the median and the largest, "none" for a
// fault after which no such push came.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	var got []time.Duration
	none := 0
	for _, d := range ds {
		if d < 0 {
			none++
		} else {
			got = append(got, d)
		}
	}
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	var s string
	switch {
	case len(got) == 1:
		s = secs(got[0])
	case len(got) > 1:
		s = fmt.Sprintf("median %s, max %s", secs(got[len(got)/2]), secs(got[len(got)-1]))
	}
	if none > 0 {
		if s != "" {
			s += "; "
		}
		s += fmt.Sprintf("none after %d of %d", none, len(ds))
	}
	return s
}

// appendPushLog appends a phase's pushes and faults to file, one a line
// in time order, times in seconds from the phase's first fault: where a
// failover's seconds went, push by push.
func appendPushLog(file, phase string, h *history) error {
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	var zero time.Time
	for _, e := range h.events {
		if zero.IsZero() || e.at.Before(zero) {
			zero = e.at
		}
	}
	rel := func(t time.Time) string { return fmt.Sprintf("%+8.2f", t.Sub(zero).Seconds()) }
	for _, e := range h.events {
		lines = append(lines, line{e.at, fmt.Sprintf("%s fault %s on %s (primary %s), healed %s", rel(e.at), e.what, e.node, e.primary, rel(e.healed))})
	}
	for _, p := range h.primaries {
		lines = append(lines, line{p.at, fmt.Sprintf("%s primary of the first repository recorded: %s", rel(p.at), p.primary)})
	}
	for _, p := range h.pushes {
		verdict := "acked, primary after " + p.primaryAfter
		if !p.acked {
			verdict = "FAILED: " + strings.ReplaceAll(p.out, "\n", " | ")
		}
		lines = append(lines, line{p.start, fmt.Sprintf("%s push %s %s #%d to %s over %s, %.2f s: %s", rel(p.start), p.repo, p.kind, p.index, p.node, p.transport, p.end.Sub(p.start).Seconds(), verdict)})
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at.Before(lines[j].at) })
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "== %s (time 0: its first fault, %s)\n", phase, zero.UTC().Format("15:04:05.000"))
	for _, l := range lines {
		fmt.Fprintln(f, l.text)
	}
	return f.Close()
}
