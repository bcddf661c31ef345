// Package limiter admits pack-generating requests through a global and a
// per-repository concurrency limit, with a bounded queue, a maximum wait and
// fair order: a freed slot goes to the longest-waiting request whose
// repository (and client) is under its own limit, so one repository's clone
// storm, or one client's pushes, queue behind themselves without starving
// the others.
package limiter

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Limiter is configured through its exported fields; zero limits mean none.
type Limiter struct {
	Global  int // concurrent requests in all
	PerRepo int // concurrent requests per repository
	// PerClient bounds the concurrent requests of one client (AcquireFor's
	// client; "" counts against nothing), so that no one client holds
	// every slot. What names the requests in its refusal ("pushes").
	PerClient int
	What      string
	MaxQueue  int           // waiting requests in all; more are refused at once
	MaxWait   time.Duration // longest a request waits before it is refused

	mu        sync.Mutex
	running   int
	perRepo   map[string]int
	perClient map[string]int
	queue     []*waiter
	avgHold   time.Duration // moving average of how long a slot is held
	admitted  int64
}

type waiter struct {
	repo, client string
	ready        chan struct{}
}

// BusyError is a refusal, with what the client should be told.
type BusyError struct {
	Repo   string
	Queued int // requests of this repository waiting
	// Client, when set, is the client whose own requests held this one
	// (PerClient of them running, as Running says).
	Client     string
	Running    int
	What       string
	TimedOut   bool
	Waited     time.Duration
	RetryAfter time.Duration
}

func (e *BusyError) Error() string {
	retry := int((e.RetryAfter + time.Second - 1) / time.Second)
	if e.Client != "" {
		return fmt.Sprintf("server busy: too many %s running from %s (max %d): waited %s in the queue, retry in %ds", e.What, e.Client, e.Running, e.Waited.Round(time.Second), retry)
	}
	if e.TimedOut {
		return fmt.Sprintf("server busy: waited %s in the queue for %s (%d more queued), retry in %ds", e.Waited.Round(time.Second), e.Repo, e.Queued, retry)
	}
	return fmt.Sprintf("server busy: %d clones of %s queued, retry in %ds", e.Queued, e.Repo, retry)
}

// Acquire waits for a slot for repo. It returns the release function and
// how long it waited, or a *BusyError (queue full, waited MaxWait) or the
// context's error.
func (l *Limiter) Acquire(ctx context.Context, repo string) (release func(), waited time.Duration, err error) {
	return l.AcquireFor(ctx, repo, "")
}

// AcquireFor is Acquire for a request of client, which counts against
// PerClient.
func (l *Limiter) AcquireFor(ctx context.Context, repo, client string) (release func(), waited time.Duration, err error) {
	start := time.Now()
	l.mu.Lock()
	if l.perRepo == nil {
		l.perRepo = map[string]int{}
		l.perClient = map[string]int{}
	}
	w := &waiter{repo: repo, client: client, ready: make(chan struct{})}
	if l.canRunLocked(w) && !l.queuedLocked(repo) {
		l.startLocked(w)
		l.mu.Unlock()
		return l.releaser(w, start), 0, nil
	}
	if l.MaxQueue > 0 && len(l.queue) >= l.MaxQueue {
		err := l.busyLocked(w, false)
		l.mu.Unlock()
		return nil, 0, err
	}
	l.queue = append(l.queue, w)
	maxWait := l.MaxWait // under the lock: SetLimits may change it
	l.mu.Unlock()

	var timeout <-chan time.Time
	if maxWait > 0 {
		t := time.NewTimer(maxWait)
		defer t.Stop()
		timeout = t.C
	}
	timedOut := false
	select {
	case <-w.ready:
		return l.releaser(w, time.Now()), time.Since(start), nil
	case <-timeout:
		timedOut = true
	case <-ctx.Done():
		err = ctx.Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-w.ready: // admitted just as we gave up: pass the slot on
		l.finishLocked(w, 0)
	default:
		l.removeLocked(w)
	}
	if timedOut {
		be := l.busyLocked(w, true)
		be.Waited = time.Since(start)
		err = be
	}
	return nil, time.Since(start), err
}

func (l *Limiter) canRunLocked(w *waiter) bool {
	return (l.Global <= 0 || l.running < l.Global) && (l.PerRepo <= 0 || l.perRepo[w.repo] < l.PerRepo) && !l.clientFullLocked(w.client)
}

// clientFullLocked: client runs PerClient requests already.
func (l *Limiter) clientFullLocked(client string) bool {
	return l.PerClient > 0 && client != "" && l.perClient[client] >= l.PerClient
}

// queuedLocked: a request of repo waits that only a free slot would let
// run (not one its own client holds back), and a new one queues behind it.
func (l *Limiter) queuedLocked(repo string) bool {
	for _, w := range l.queue {
		if w.repo == repo && !l.clientFullLocked(w.client) {
			return true
		}
	}
	return false
}

func (l *Limiter) startLocked(w *waiter) {
	l.running++
	l.perRepo[w.repo]++
	if w.client != "" {
		l.perClient[w.client]++
	}
	l.admitted++
}

func (l *Limiter) releaser(w *waiter, start time.Time) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.finishLocked(w, time.Since(start))
		})
	}
}

// finishLocked frees a slot and hands freed capacity to waiters in order.
func (l *Limiter) finishLocked(done *waiter, held time.Duration) {
	l.running--
	if l.perRepo[done.repo]--; l.perRepo[done.repo] <= 0 {
		delete(l.perRepo, done.repo)
	}
	if done.client != "" {
		if l.perClient[done.client]--; l.perClient[done.client] <= 0 {
			delete(l.perClient, done.client)
		}
	}
	if held > 0 {
		if l.avgHold == 0 {
			l.avgHold = held
		} else {
			l.avgHold = (l.avgHold*7 + held) / 8
		}
	}
	l.admitLocked()
}

// admitLocked starts the waiters, in order, that the limits now allow.
func (l *Limiter) admitLocked() {
	for i := 0; i < len(l.queue); {
		w := l.queue[i]
		if l.canRunLocked(w) {
			l.startLocked(w)
			l.queue = append(l.queue[:i], l.queue[i+1:]...)
			close(w.ready)
			continue
		}
		if l.Global > 0 && l.running >= l.Global {
			break
		}
		i++
	}
}

func (l *Limiter) removeLocked(w *waiter) {
	for i, x := range l.queue {
		if x == w {
			l.queue = append(l.queue[:i], l.queue[i+1:]...)
			return
		}
	}
}

// busyLocked describes the refusal; the retry hint is the time the queue
// ahead would take at the recent pace, between 5s and 5m.
func (l *Limiter) busyLocked(w *waiter, timedOut bool) *BusyError {
	repo := w.repo
	if l.clientFullLocked(w.client) {
		what := l.What
		if what == "" {
			what = "requests"
		}
		return &BusyError{Repo: repo, Client: w.client, Running: l.PerClient, What: what, TimedOut: timedOut, RetryAfter: 5 * time.Second}
	}
	queued := 0
	for _, w := range l.queue {
		if w.repo == repo {
			queued++
		}
	}
	slots := l.PerRepo
	if slots <= 0 || (l.Global > 0 && l.Global < slots) {
		slots = max(l.Global, 1)
	}
	hold := l.avgHold
	if hold == 0 {
		hold = 10 * time.Second
	}
	retry := hold * time.Duration(queued/slots+1)
	retry = min(max(retry, 5*time.Second), 5*time.Minute)
	return &BusyError{Repo: repo, Queued: queued, TimedOut: timedOut, RetryAfter: retry.Round(time.Second)}
}

// SetLimits changes the limits of a running limiter (a configuration
// reload): requests running keep their slots, and waiters that the new
// limits allow start at once.
func (l *Limiter) SetLimits(global, perRepo, perClient, maxQueue int, maxWait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Global, l.PerRepo, l.PerClient, l.MaxQueue, l.MaxWait = global, perRepo, perClient, maxQueue, maxWait
	l.admitLocked()
}

// PerClientLimit is PerClient, read under the lock SetLimits takes.
func (l *Limiter) PerClientLimit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.PerClient
}

// Stats is the limiter's state now.
func (l *Limiter) Stats() (running, queued int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running, len(l.queue)
}

// Usage is the limiter's state for a status page.
type Usage struct {
	Global, PerRepo, MaxQueue int // the configured limits (0: none)
	Running, Queued           int
	Admitted                  int64       // requests admitted since start
	Repos                     []RepoUsage // repositories with running or queued requests, busiest first
}

// RepoUsage is one repository's share of the limiter.
type RepoUsage struct {
	Repo            string
	Running, Queued int
}

// Usage returns the limiter's state now, per repository.
func (l *Limiter) Usage() Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := Usage{Global: l.Global, PerRepo: l.PerRepo, MaxQueue: l.MaxQueue, Running: l.running, Queued: len(l.queue), Admitted: l.admitted}
	byRepo := map[string]*RepoUsage{}
	get := func(repo string) *RepoUsage {
		r := byRepo[repo]
		if r == nil {
			r = &RepoUsage{Repo: repo}
			byRepo[repo] = r
		}
		return r
	}
	for repo, n := range l.perRepo {
		get(repo).Running = n
	}
	for _, w := range l.queue {
		get(w.repo).Queued++
	}
	for _, r := range byRepo {
		u.Repos = append(u.Repos, *r)
	}
	sort.Slice(u.Repos, func(i, j int) bool {
		a, b := u.Repos[i], u.Repos[j]
		if a.Running+a.Queued != b.Running+b.Queued {
			return a.Running+a.Queued > b.Running+b.Queued
		}
		return a.Repo < b.Repo
	})
	return u
}
