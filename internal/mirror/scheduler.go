// Package mirror keeps repositories in step with others: read-only pull
// mirrors, synced from upstream on an interval and on demand into a
// quarantine and then in one ref transaction, and push mirrors, to which
// every acknowledged push is sent on through the outbox (queued, retried,
// one push at a time per mirror). What a repository mirrors lives in its
// own git config (config.go), credentials beside it (credentials.go).
package mirror

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"packwire/internal/repo"
)

// DefaultCheck is how often the scheduler looks for pull mirrors due.
const DefaultCheck = time.Minute

// Scheduler syncs each pull mirror once its interval has passed since its
// last sync (kept in the repository, so a restart neither repeats nor
// skips one), at most Concurrency at a time.
type Scheduler struct {
	Syncer      *Syncer
	Repos       func() ([]repo.Repo, error)
	Check       time.Duration // between looks (default DefaultCheck)
	Concurrency int           // syncs at once (default 2)
	Log         *slog.Logger
}

// Run looks at once (mirrors overdue while the server was down are synced
// first), then every Check, until ctx ends; a sync in progress is killed.
func (s *Scheduler) Run(ctx context.Context) {
	check := s.Check
	if check <= 0 {
		check = DefaultCheck
	}
	t := time.NewTicker(check)
	defer t.Stop()
	for {
		s.Pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass syncs every pull mirror that is due and returns how many it synced.
func (s *Scheduler) Pass(ctx context.Context) int {
	log := s.Log
	if log == nil {
		log = slog.Default()
	}
	repos, err := s.Repos()
	if err != nil {
		log.Error("mirror: listing repositories", "error", err.Error())
		return 0
	}
	concurrency := s.Concurrency
	if concurrency <= 0 {
		concurrency = 2
	}
	slots := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	synced := 0
	now := time.Now()
	for _, r := range repos {
		if ctx.Err() != nil {
			break
		}
		cfg, err := ReadConfig(r) // one small file read per repository
		if err != nil || !cfg.IsPullMirror() {
			continue
		}
		st, _ := ReadState(r)
		if now.Sub(st.LastSync) < cfg.Interval {
			continue
		}
		slots <- struct{}{}
		wg.Add(1)
		go func(r repo.Repo) {
			defer wg.Done()
			defer func() { <-slots }()
			// ErrElsewhere (another node of a cluster syncs it) is no failure.
			if _, err := s.Syncer.Sync(ctx, r, "interval"); err == nil {
				mu.Lock()
				synced++
				mu.Unlock()
			}
		}(r)
	}
	wg.Wait()
	return synced
}
