package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"packwire/internal/store"
)

// Defaults of a Loop's zero fields.
const (
	DefaultConcurrency = 4
	DefaultMinBackoff  = 10 * time.Second
	DefaultMaxBackoff  = time.Hour
	DefaultGiveUpAfter = 24 * time.Hour
	DefaultPoll        = time.Second
	DefaultRetention   = 7 * 24 * time.Hour
	DefaultTimeout     = 10 * time.Second
)

// Sender makes one attempt at a delivery. ctx carries the attempt's
// deadline (Kind.Timeout) and ends when the server stops.
type Sender interface {
	Send(ctx context.Context, d store.Delivery) Result
}

// SenderFunc is a Sender made of a function.
type SenderFunc func(ctx context.Context, d store.Delivery) Result

func (f SenderFunc) Send(ctx context.Context, d store.Delivery) Result { return f(ctx, d) }

// Result is how an attempt went.
type Result struct {
	Status    int   // HTTP status, if there was an answer (webhooks)
	Err       error // nil: delivered
	Permanent bool  // no retry can help: the target is gone
}

// Kind is how one kind of delivery is sent.
type Kind struct {
	Sender  Sender
	Timeout time.Duration // per attempt (default DefaultTimeout)
	// Coalesce: one attempt sends the target's whole current state (a push
	// mirror pushes every ref), so its success also delivers the target's
	// older pending deliveries.
	Coalesce bool
}

// Loop delivers what is queued in the store until its context ends.
type Loop struct {
	Store *store.Store
	Kinds map[string]Kind // by store.Delivery.Kind
	// Concurrency bounds attempts in flight in all; a target never has more
	// than one, so a slow or dead receiver holds one slot at most.
	Concurrency int
	// MinBackoff, doubling per failed attempt up to MaxBackoff, is the
	// wait before a retry.
	MinBackoff, MaxBackoff time.Duration
	// GiveUpAfter: a delivery whose next retry would fall this long after
	// it was queued fails for good (0: DefaultGiveUpAfter; negative:
	// never). MaxAttempts (0: no bound) also ends it.
	GiveUpAfter time.Duration
	MaxAttempts int
	// Poll is how often the store is asked for due deliveries: rows the
	// command line queued (repo-create) and retries come due this way.
	Poll time.Duration
	// Retention is how long finished deliveries stay listed.
	Retention time.Duration
	Log       *slog.Logger

	once     sync.Once
	wake     chan struct{}
	mu       sync.Mutex
	busy     map[string]bool                          // targets with an attempt in flight
	timeouts atomic.Pointer[map[string]time.Duration] // SetTimeouts': by kind, over Kind.Timeout
}

// SetTimeouts changes the per-attempt timeout of the kinds named, for
// attempts that start from now on (a configuration reload); an attempt
// in flight keeps its deadline.
func (l *Loop) SetTimeouts(byKind map[string]time.Duration) {
	set := maps.Clone(byKind)
	l.timeouts.Store(&set)
}

func (l *Loop) init() {
	l.once.Do(func() {
		l.wake = make(chan struct{}, 1)
		l.busy = map[string]bool{}
		if l.Concurrency <= 0 {
			l.Concurrency = DefaultConcurrency
		}
		if l.MinBackoff <= 0 {
			l.MinBackoff = DefaultMinBackoff
		}
		if l.MaxBackoff < l.MinBackoff {
			l.MaxBackoff = max(l.MinBackoff, DefaultMaxBackoff)
		}
		if l.Poll <= 0 {
			l.Poll = DefaultPoll
		}
		if l.Retention <= 0 {
			l.Retention = DefaultRetention
		}
		if l.Log == nil {
			l.Log = slog.Default()
		}
	})
}

// Wake makes the loop look for due deliveries now. It never blocks.
func (l *Loop) Wake() {
	l.init()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Run delivers until ctx ends, then waits for the attempts in flight,
// which ctx cancels: they stay pending and are made again once their
// claim runs out (the kind's timeout and claimMargin), by this loop's next
// start or another loop.
func (l *Loop) Run(ctx context.Context) {
	l.init()
	slots := make(chan struct{}, l.Concurrency)
	var attempts sync.WaitGroup
	defer attempts.Wait()
	poll := time.NewTicker(l.Poll)
	defer poll.Stop()
	trim := time.NewTicker(time.Hour)
	defer trim.Stop()
	l.trim(ctx)
	for {
		l.dispatch(ctx, slots, &attempts)
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-poll.C:
		case <-trim.C:
			l.trim(ctx)
		}
	}
}

// dispatch starts an attempt for each due target that has none in flight,
// as far as slots allow.
func (l *Loop) dispatch(ctx context.Context, slots chan struct{}, attempts *sync.WaitGroup) {
	free := cap(slots) - len(slots)
	if free <= 0 || ctx.Err() != nil {
		return
	}
	// An idle server polls every second: asking first when the next
	// delivery is due costs a seventh of reading due ones (an index's
	// first entry against a grouped query SQLite compiles anew each time).
	now := time.Now()
	if next, err := l.Store.NextDue(ctx); err == nil && (next.IsZero() || next.After(now)) {
		return
	}
	l.mu.Lock()
	busy := len(l.busy)
	l.mu.Unlock()
	due, err := l.Store.DueDeliveries(ctx, now, free+busy)
	if err != nil {
		if ctx.Err() == nil {
			l.Log.Error("outbox: reading due deliveries", "error", err.Error())
		}
		return
	}
	for _, d := range due {
		key := d.Kind + "\x00" + d.Target
		l.mu.Lock()
		if l.busy[key] {
			l.mu.Unlock()
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			l.mu.Unlock()
			return
		}
		l.busy[key] = true
		l.mu.Unlock()
		attempts.Add(1)
		go func(d store.Delivery) {
			defer attempts.Done()
			recorded := l.attempt(ctx, d)
			l.mu.Lock()
			delete(l.busy, key)
			l.mu.Unlock()
			<-slots
			if recorded {
				l.Wake() // the target may have more due, and a slot is free
			}
		}(d)
	}
}

// attempt makes one attempt at d and records it. It reports whether it
// recorded one (otherwise d is left as it was, for the next poll).
func (l *Loop) attempt(ctx context.Context, d store.Delivery) bool {
	kind, ok := l.Kinds[d.Kind]
	if !ok {
		kind = Kind{Sender: SenderFunc(func(context.Context, store.Delivery) Result {
			return Result{Err: fmt.Errorf("no sender for deliveries of kind %q", d.Kind), Permanent: true}
		})}
	}
	timeout := kind.Timeout
	if set := l.timeouts.Load(); set != nil {
		if t, ok := (*set)[d.Kind]; ok {
			timeout = t
		}
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	// d was read before this target's previous attempt may have ended
	// (dispatch reads due deliveries, then finds the target free), and
	// other loops (every node of a cluster) read the same rows: it is sent
	// only if it is still as read, and taken for the attempt's time. A
	// stale copy would send a delivered webhook again, or retry a failed
	// one at once under the same attempt number.
	now := time.Now()
	if taken, err := l.Store.ClaimDelivery(ctx, d, now, now.Add(timeout+claimMargin)); err != nil || !taken {
		if err != nil && ctx.Err() == nil {
			l.Log.Warn("outbox: claiming a delivery", "delivery", d.ID, "error", err.Error())
		}
		return false
	}
	var covers int64
	if kind.Coalesce {
		// Read before sending: whatever is queued now was written to the
		// repository before this attempt reads it.
		var err error
		if covers, err = l.Store.LastPendingID(ctx, d.Kind, d.Target); err != nil {
			covers = 0
		}
	}
	attemptCtx, cancel := context.WithTimeout(ctx, timeout)
	start := time.Now()
	res := kind.Sender.Send(attemptCtx, d)
	latency := time.Since(start)
	timedOut := errors.Is(attemptCtx.Err(), context.DeadlineExceeded)
	cancel()
	if res.Err != nil && ctx.Err() != nil {
		return false // cut by the shutdown: still pending, made again at the next start
	}
	a := store.Attempt{Number: d.Attempts + 1, Start: start, Latency: latency, Status: res.Status}
	if res.Err != nil {
		a.Error = oneLine(res.Err.Error())
		if timedOut {
			a.Error = fmt.Sprintf("timed out after %s: %s", timeout, a.Error)
		}
	}
	out := l.outcome(d, a.Number, res, time.Now())
	recordCtx := context.WithoutCancel(ctx)
	if err := l.Store.RecordAttempt(recordCtx, d, a, out); err != nil {
		l.Log.Error("outbox: recording an attempt", "delivery", d.ID, "error", err.Error())
		return false
	}
	attrs := []any{"delivery", d.ID, "guid", d.GUID, "kind", d.Kind, "target", d.Target, "repo", d.Repo, "event", d.Event,
		"attempt", a.Number, "latency_ms", latency.Milliseconds(), "state", out.State}
	if a.Status != 0 {
		attrs = append(attrs, "status", a.Status)
	}
	switch {
	case res.Err == nil:
		if kind.Coalesce && covers > d.ID {
			if n, err := l.Store.CoverDeliveries(recordCtx, d.Kind, d.Target, covers, d.ID); err == nil && n > 0 {
				attrs = append(attrs, "covered", n)
			}
		}
		l.Log.Info("outbox: delivered", attrs...)
	case out.State == store.DeliveryPending:
		l.Log.Warn("outbox: attempt failed, will retry", append(attrs, "retry_at", out.Next.UTC().Format(time.RFC3339), "error", a.Error)...)
	default:
		l.Log.Error("outbox: delivery failed for good", append(attrs, "error", a.Error)...)
	}
	return true
}

// claimMargin is how long past its timeout an attempt keeps its delivery
// from other loops: its outcome is recorded within that.
const claimMargin = 30 * time.Second

// outcome decides what follows attempt number n.
func (l *Loop) outcome(d store.Delivery, n int, res Result, now time.Time) store.Outcome {
	switch {
	case res.Err == nil:
		return store.Outcome{State: store.DeliveryDelivered}
	case res.Permanent, l.MaxAttempts > 0 && n >= l.MaxAttempts:
		return store.Outcome{State: store.DeliveryFailed}
	}
	next := now.Add(l.Backoff(n))
	giveUp := l.GiveUpAfter
	if giveUp == 0 {
		giveUp = DefaultGiveUpAfter
	}
	if giveUp > 0 && next.Sub(d.Created) > giveUp {
		return store.Outcome{State: store.DeliveryFailed}
	}
	return store.Outcome{State: store.DeliveryPending, Next: next}
}

// Backoff is the wait after the nth failed attempt: MinBackoff doubled
// n-1 times, at most MaxBackoff.
func (l *Loop) Backoff(n int) time.Duration {
	l.init()
	b := l.MinBackoff
	for i := 1; i < n && b < l.MaxBackoff; i++ {
		b *= 2
	}
	return min(b, l.MaxBackoff)
}

// trim removes finished deliveries past Retention.
func (l *Loop) trim(ctx context.Context) {
	n, err := l.Store.TrimDeliveries(ctx, time.Now().Add(-l.Retention))
	switch {
	case err != nil && ctx.Err() == nil:
		l.Log.Warn("outbox: trimming finished deliveries", "error", err.Error())
	case n > 0:
		l.Log.Info("outbox: finished deliveries trimmed", "removed", n, "retention", l.Retention.String())
	}
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 500 {
		s = s[:500] + "..."
	}
	return s
}
