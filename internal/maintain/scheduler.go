package maintain

import (
	"context"
	"errors"
	"sync"
	"time"

	"packwire/internal/repo"
)

// Scheduler checks every repository each Interval, removes stale push
// quarantines and runs what Plan says is needed, at most Concurrency at a
// time, within a CPU budget.
type Scheduler struct {
	M           *Maintainer
	Repos       func() ([]repo.Repo, error)
	Interval    time.Duration // between passes over all repositories
	Concurrency int           // repositories maintained at once (default 1)
	// Budget is the CPU (user+system of maintenance git) allowed per hour;
	// when the last hour's runs used it up, the pass stops early. 0: none.
	Budget time.Duration
	// Sweep, if set, runs at the start of every pass, for housekeeping
	// beyond single repositories (the trash of deleted ones).
	Sweep func(context.Context)

	mu   sync.Mutex
	used []spent // runs of the last hour
}

type spent struct {
	at  time.Time
	cpu time.Duration
}

// Run makes a pass every Interval (the first one Interval after the start)
// until ctx ends; a run in progress is killed then.
func (s *Scheduler) Run(ctx context.Context) {
	if s.Interval <= 0 {
		return
	}
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Pass(ctx)
		}
	}
}

// spentLastHour is the CPU maintenance used in the hour before now.
func (s *Scheduler) spentLastHour(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := s.used[:0]
	var total time.Duration
	for _, u := range s.used {
		if now.Sub(u.at) < time.Hour {
			keep = append(keep, u)
			total += u.cpu
		}
	}
	s.used = keep
	return total
}

// Pass checks every repository once. It returns how many runs it made.
func (s *Scheduler) Pass(ctx context.Context) int {
	if s.Sweep != nil {
		s.Sweep(ctx)
	}
	repos, err := s.Repos()
	if err != nil {
		s.M.Log.Error("maintenance: listing repositories", "error", err.Error())
		return 0
	}
	// Quarantines that killed pushes left first, in every repository: one
	// directory read each, and the CPU budget must not starve them.
	for _, r := range repos {
		if ctx.Err() != nil {
			return 0
		}
		s.M.RemoveStaleQuarantines(r)
	}
	n := max(s.Concurrency, 1)
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	runs := 0
	for _, r := range repos {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{} // before the budget check: it must see the runs that just ended
		if s.Budget > 0 {
			if used := s.spentLastHour(time.Now()); used >= s.Budget {
				<-sem
				s.M.Log.Info("maintenance: CPU budget used up for this hour, pass stopped", "used_ms", used.Milliseconds(), "budget_ms", s.Budget.Milliseconds())
				break
			}
		}
		wg.Add(1)
		go func(r repo.Repo) {
			defer wg.Done()
			defer func() { <-sem }()
			kind, reason, err := s.M.Plan(ctx, r.Path)
			if err != nil {
				s.M.Log.Warn("maintenance: checking", "repo", r.Name, "error", err.Error())
				return
			}
			if kind == None {
				return
			}
			run, err := s.M.Run(ctx, r, kind, reason)
			if errors.Is(err, ErrBusy) {
				return
			}
			s.mu.Lock()
			s.used = append(s.used, spent{at: time.Now(), cpu: run.UserCPU + run.SysCPU})
			s.mu.Unlock()
			mu.Lock()
			runs++
			mu.Unlock()
		}(r)
	}
	wg.Wait()
	return runs
}
