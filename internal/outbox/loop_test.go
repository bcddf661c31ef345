package outbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"packwire/internal/store"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "packwire.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestBackoffDoublesToTheCap(t *testing.T) {
	l := &Loop{MinBackoff: 10 * time.Second, MaxBackoff: time.Hour}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second}
	for i, w := range want {
		if got := l.Backoff(i + 1); got != w {
			t.Fatalf("backoff(%d) = %s, want %s", i+1, got, w)
		}
	}
	if got := l.Backoff(30); got != time.Hour {
		t.Fatalf("backoff(30) = %s", got)
	}
	// 10 s doubling to 1 h, given up after a day: about 30 attempts.
	d := store.Delivery{Created: time.Now()}
	now, n := d.Created, 0
	for {
		n++
		o := l.outcome(d, n, Result{Err: errors.New("down")}, now)
		if o.State != store.DeliveryPending {
			break
		}
		now = o.Next
	}
	if n < 25 || n > 35 || now.Sub(d.Created) > 24*time.Hour {
		t.Fatalf("gave up after %d attempts, %s", n, now.Sub(d.Created))
	}
}

// One attempt in flight per target, failures retried until delivered, a
// coalescing kind's success covering what was queued before it, and a
// stopped loop's pending rows picked up by the next one.
func TestLoopRetriesSerializesAndCoalesces(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	var inFlight, maxInFlight atomic.Int32
	var mu sync.Mutex
	calls := map[string]int{}
	flaky := SenderFunc(func(ctx context.Context, d store.Delivery) Result {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		calls[d.Target]++
		c := calls[d.Target]
		mu.Unlock()
		if d.Target == "down" && c <= 2 {
			return Result{Status: 500, Err: errors.New("HTTP 500")}
		}
		return Result{Status: 200}
	})
	var mirrorPushes atomic.Int32
	mirror := SenderFunc(func(ctx context.Context, d store.Delivery) Result {
		mirrorPushes.Add(1)
		return Result{}
	})
	var queued []store.NewDelivery
	for i := 0; i < 3; i++ {
		queued = append(queued, store.NewDelivery{Kind: store.KindWebhook, Target: "down", Repo: "r", Event: "push", Payload: []byte("{}")},
			store.NewDelivery{Kind: store.KindWebhook, Target: "up", Repo: "r", Event: "push", Payload: []byte("{}")})
	}
	for i := 0; i < 5; i++ {
		queued = append(queued, store.NewDelivery{Kind: store.KindPushMirror, Target: "r#1", Repo: "r", Event: "push", Payload: []byte("{}")})
	}
	if err := st.EnqueueDeliveries(ctx, queued); err != nil {
		t.Fatal(err)
	}
	l := &Loop{Store: st, Log: quiet, Concurrency: 8, MinBackoff: 30 * time.Millisecond, MaxBackoff: 60 * time.Millisecond, Poll: 20 * time.Millisecond,
		Kinds: map[string]Kind{store.KindWebhook: {Sender: flaky}, store.KindPushMirror: {Sender: mirror, Coalesce: true}}}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { l.Run(runCtx); close(done) }()
	awaitDelivered(t, st, store.DeliveryFilter{Limit: 100})
	stop()
	<-done
	if m := maxInFlight.Load(); m > 2 {
		t.Fatalf("%d webhook attempts in flight at once for 2 targets", m)
	}
	if n := mirrorPushes.Load(); n != 1 {
		t.Fatalf("push mirror pushed %d times for 5 queued pushes, want 1 (coalesced)", n)
	}
	ds, _ := st.Deliveries(ctx, store.DeliveryFilter{Kind: store.KindWebhook, Target: "down", Limit: 10})
	var attempts int
	for _, d := range ds {
		if d.State != store.DeliveryDelivered {
			t.Fatalf("delivery %d: %s", d.ID, d.State)
		}
		attempts += d.Attempts
	}
	if attempts != 5 { // two failures, then three successes
		t.Fatalf("%d attempts for the flaky target, want 5", attempts)
	}
	failures := 0
	for _, d := range ds {
		as, _ := st.Attempts(ctx, d.ID)
		if len(as) != d.Attempts || as[len(as)-1].Status != 200 || as[len(as)-1].Error != "" {
			t.Fatalf("delivery %d's attempts: %+v", d.ID, as)
		}
		for _, a := range as[:len(as)-1] {
			if a.Status != 500 || a.Error != "HTTP 500" || a.Latency <= 0 {
				t.Fatalf("failed attempt recorded as %+v", a)
			}
			failures++
		}
	}
	if failures != 2 {
		t.Fatalf("%d failed attempts recorded, want 2", failures)
	}

	// A loop stopped with work pending leaves it for the next one.
	if err := st.EnqueueDeliveries(ctx, []store.NewDelivery{{Kind: store.KindWebhook, Target: "late", Repo: "r", Event: "push", Payload: []byte("{}")}}); err != nil {
		t.Fatal(err)
	}
	l2 := &Loop{Store: st, Log: quiet, Poll: 20 * time.Millisecond, Kinds: l.Kinds}
	runCtx, stop = context.WithCancel(ctx)
	go l2.Run(runCtx)
	defer stop()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		if ds, _ := st.Deliveries(ctx, store.DeliveryFilter{Target: "late"}); len(ds) == 1 && ds[0].State == store.DeliveryDelivered {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("a second loop did not deliver what was queued before it started")
}

// TestStaleDeliveryIsNotSentAgain: dispatch reads due deliveries before
// a target's attempt in flight may end; the copy it read must not be
// sent once that attempt has recorded its outcome (a delivered webhook
// would go out twice, a failed one be retried at once under the same
// attempt number: TestLoopRetriesSerializesAndCoalesces saw 4 attempts
// for 5 sends under -race).
func TestStaleDeliveryIsNotSentAgain(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	if err := st.EnqueueDeliveries(ctx, []store.NewDelivery{{Kind: store.KindWebhook, Target: "t", Repo: "r", Event: "push", Payload: []byte("{}")}}); err != nil {
		t.Fatal(err)
	}
	due, err := st.DueDeliveries(ctx, time.Now(), 10)
	if err != nil || len(due) != 1 {
		t.Fatalf("due: %v %v", due, err)
	}
	stale := due[0]
	var sends atomic.Int32
	fail := true
	l := &Loop{Store: st, Log: quiet, MinBackoff: time.Hour, MaxBackoff: time.Hour,
		Kinds: map[string]Kind{store.KindWebhook: {Sender: SenderFunc(func(context.Context, store.Delivery) Result {
			sends.Add(1)
			if fail {
				return Result{Status: 500, Err: errors.New("HTTP 500")}
			}
			return Result{Status: 200}
		})}}}
	l.init()
	if !l.attempt(ctx, stale) {
		t.Fatal("the first attempt was not recorded")
	}
	fail = false
	// The copy read before the failure: the retry is an hour away.
	if l.attempt(ctx, stale) || sends.Load() != 1 {
		t.Fatalf("a stale copy was sent again: %d sends", sends.Load())
	}
	d, err := st.GetDelivery(ctx, stale.ID)
	if err != nil || d.Attempts != 1 || d.State != store.DeliveryPending {
		t.Fatalf("after one failed attempt: %+v %v", d, err)
	}
}

// TestTwoLoopsSendEachDeliveryOnce: two loops over one store (two nodes
// of a cluster on one database) send every delivery exactly once.
func TestTwoLoopsSendEachDeliveryOnce(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	var queued []store.NewDelivery
	for i := range 40 {
		queued = append(queued, store.NewDelivery{Kind: store.KindWebhook, Target: string(rune('a' + i%5)), Repo: "r", Event: "push", Payload: []byte("{}")})
	}
	if err := st.EnqueueDeliveries(ctx, queued); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	sent := map[int64]int{}
	sender := SenderFunc(func(ctx context.Context, d store.Delivery) Result {
		time.Sleep(time.Millisecond)
		mu.Lock()
		sent[d.ID]++
		mu.Unlock()
		return Result{Status: 200}
	})
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		l := &Loop{Store: st, Log: quiet, Concurrency: 8, Poll: 2 * time.Millisecond, Kinds: map[string]Kind{store.KindWebhook: {Sender: sender}}}
		wg.Add(1)
		go func() { defer wg.Done(); l.Run(runCtx) }()
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(sent)
		mu.Unlock()
		if n == len(queued) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d deliveries sent", n, len(queued))
		}
	}
	stop()
	wg.Wait()
	for id, n := range sent {
		if n != 1 {
			t.Errorf("delivery %d sent %d times", id, n)
		}
	}
}

// TestTwoLoopsPushOneMirrorAtATime: two delivery loops (two nodes of a
// cluster) on one store never push to the same push mirror at once, though
// each holds a delivery of it: the newer one waits while the older one is
// claimed, and is covered by its push.
func TestTwoLoopsPushOneMirrorAtATime(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	var queued []store.NewDelivery
	for range 6 {
		queued = append(queued, store.NewDelivery{Kind: store.KindPushMirror, Target: "app#1", Repo: "app", Event: "push", Payload: []byte("{}")})
	}
	if err := st.EnqueueDeliveries(ctx, queued); err != nil {
		t.Fatal(err)
	}
	var inFlight, most, sends atomic.Int32
	sender := SenderFunc(func(ctx context.Context, d store.Delivery) Result {
		n := inFlight.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		inFlight.Add(-1)
		sends.Add(1)
		return Result{}
	})
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 2 {
		l := &Loop{Store: st, Log: quiet, Concurrency: 4, Poll: time.Millisecond,
			Kinds: map[string]Kind{store.KindPushMirror: {Sender: sender, Coalesce: true}}}
		wg.Add(1)
		go func() { defer wg.Done(); l.Run(runCtx) }()
	}
	awaitDelivered(t, st, store.DeliveryFilter{Kind: store.KindPushMirror})
	stop()
	wg.Wait()
	if most.Load() != 1 {
		t.Fatalf("%d pushes to one mirror at once", most.Load())
	}
	if sends.Load() == 0 {
		t.Fatal("nothing was sent")
	}
}

// awaitDelivered waits (20 s at most) until no delivery f lists is pending.
func awaitDelivered(t *testing.T, st *store.Store, f store.DeliveryFilter) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ds, err := st.Deliveries(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		pending := 0
		for _, d := range ds {
			if d.State == store.DeliveryPending {
				pending++
			}
		}
		if pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d deliveries still pending", pending)
		}
	}
}
