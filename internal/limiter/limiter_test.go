package limiter

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestGlobalAndPerRepoLimits(t *testing.T) {
	l := &Limiter{Global: 3, PerRepo: 2, MaxQueue: 10, MaxWait: time.Second}
	ctx := context.Background()
	a1, _, _ := l.Acquire(ctx, "a")
	a2, _, _ := l.Acquire(ctx, "a")
	// a is at its per-repo limit; b still gets in.
	b1, w, err := l.Acquire(ctx, "b")
	if err != nil || w != 0 {
		t.Fatalf("b blocked by a's limit: %v %v", w, err)
	}
	if r, q := l.Stats(); r != 3 || q != 0 {
		t.Fatalf("stats %d %d", r, q)
	}
	got := make(chan string, 3)
	go func() { rel, _, _ := l.Acquire(ctx, "a"); got <- "a3"; rel() }()
	time.Sleep(20 * time.Millisecond)
	go func() { rel, _, _ := l.Acquire(ctx, "c"); got <- "c1"; rel() }()
	time.Sleep(20 * time.Millisecond)
	if _, q := l.Stats(); q != 2 {
		t.Fatalf("queued %d", q)
	}
	// b leaves: a3 is first in line but a is still at its limit, so c1 goes.
	b1()
	if first := <-got; first != "c1" {
		t.Fatalf("%s admitted; a waiter over its repo's limit blocked another repo", first)
	}
	a1()
	if next := <-got; next != "a3" {
		t.Fatalf("then %s", next)
	}
	a2()
}

func TestQueueFullAndTimeout(t *testing.T) {
	l := &Limiter{Global: 1, MaxQueue: 1, MaxWait: 100 * time.Millisecond}
	ctx := context.Background()
	rel, _, _ := l.Acquire(ctx, "team/app")
	defer rel()
	done := make(chan error)
	go func() { _, _, err := l.Acquire(ctx, "team/app"); done <- err }()
	time.Sleep(20 * time.Millisecond)
	_, _, err := l.Acquire(ctx, "team/app")
	var be *BusyError
	if !errors.As(err, &be) || be.TimedOut || be.Queued != 1 || !strings.HasPrefix(err.Error(), "server busy: 1 clones of team/app queued, retry in ") {
		t.Fatalf("queue full: %v", err)
	}
	err = <-done
	if !errors.As(err, &be) || !be.TimedOut || be.RetryAfter < 5*time.Second {
		t.Fatalf("timeout: %v", err)
	}
	if _, q := l.Stats(); q != 0 {
		t.Fatal("timed-out waiter left in the queue")
	}
}

func TestCancelledWaiterLeavesNoSlotBehind(t *testing.T) {
	l := &Limiter{Global: 1}
	rel, _, _ := l.Acquire(context.Background(), "r")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() { _, _, err := l.Acquire(ctx, "r"); errc <- err }()
	time.Sleep(10 * time.Millisecond)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	rel()
	if r, q := l.Stats(); r != 0 || q != 0 {
		t.Fatalf("running %d queued %d", r, q)
	}
}

func TestNoOverAdmissionUnderContention(t *testing.T) {
	l := &Limiter{Global: 4, PerRepo: 2, MaxWait: 5 * time.Second}
	var mu sync.Mutex
	running, perRepo, maxRunning := 0, map[string]int{}, 0
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		repo := []string{"a", "b", "c"}[i%3]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, _, err := l.Acquire(context.Background(), repo)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			running++
			perRepo[repo]++
			if running > 4 || perRepo[repo] > 2 {
				t.Errorf("over limit: %d running, %d of %s", running, perRepo[repo], repo)
			}
			maxRunning = max(maxRunning, running)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			running--
			perRepo[repo]--
			mu.Unlock()
			rel()
		}()
	}
	wg.Wait()
	if maxRunning < 4 {
		t.Errorf("never used the whole capacity: %d", maxRunning)
	}
}

func TestUsagePerRepository(t *testing.T) {
	l := &Limiter{Global: 2, PerRepo: 1, MaxQueue: 10, MaxWait: 5 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a1, _, _ := l.Acquire(ctx, "a")
	b1, _, _ := l.Acquire(ctx, "b")
	var wg sync.WaitGroup
	for _, repo := range []string{"a", "a", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rel, _, err := l.Acquire(ctx, repo); err == nil {
				rel()
			}
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, q := l.Stats(); q == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("waiters never queued")
		}
	}
	u := l.Usage()
	want := []RepoUsage{{"a", 1, 2}, {"b", 1, 0}, {"c", 0, 1}}
	if u.Global != 2 || u.PerRepo != 1 || u.MaxQueue != 10 || u.Running != 2 || u.Queued != 3 || u.Admitted != 2 || len(u.Repos) != len(want) {
		t.Fatalf("usage %+v", u)
	}
	for i := range want {
		if u.Repos[i] != want[i] {
			t.Fatalf("repo %d: %+v, want %+v (all: %+v)", i, u.Repos[i], want[i], u.Repos)
		}
	}
	a1()
	b1()
	wg.Wait()
	if u := l.Usage(); u.Running != 0 || u.Queued != 0 || len(u.Repos) != 0 || u.Admitted != 5 {
		t.Fatalf("after all left: %+v", u)
	}
}

// TestPerClient: a client at its PerClient bound waits for its own
// requests, without holding back another client's request for the same
// repository, and gets its slot when one of its own ends; past MaxWait
// the refusal names the client.
func TestPerClient(t *testing.T) {
	ctx := context.Background()
	l := &Limiter{Global: 4, PerClient: 1, What: "pushes", MaxWait: time.Minute}
	eve1, _, err := l.AcquireFor(ctx, "r", "eve")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func(), 1)
	go func() { rel, _, _ := l.AcquireFor(ctx, "r", "eve"); got <- rel }()
	for _, q := l.Stats(); q != 1; _, q = l.Stats() {
		time.Sleep(time.Millisecond)
	}
	bob, w, err := l.AcquireFor(ctx, "r", "bob")
	if err != nil || w != 0 {
		t.Fatalf("bob behind eve's queued request: waited %v, %v", w, err)
	}
	bob()
	select {
	case <-got:
		t.Fatal("eve's second request ran beside her first")
	default:
	}
	eve1()
	(<-got)()

	short := &Limiter{Global: 4, PerClient: 1, What: "pushes", MaxWait: 10 * time.Millisecond}
	rel, _, _ := short.AcquireFor(ctx, "r", "eve")
	defer rel()
	_, _, err = short.AcquireFor(ctx, "r", "eve")
	var be *BusyError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "too many pushes running from eve (max 1)") {
		t.Fatalf("refusal: %v", err)
	}
}
