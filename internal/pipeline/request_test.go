package pipeline

import (
	"context"
	"errors"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"
)

// TestPaceWatchCutsOffASlowRequest: a request that falls behind its pace is
// cancelled with ErrTooSlow, and stop reports it.
func TestPaceWatchCutsOffASlowRequest(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var n atomic.Int64
	n.Store(10) // far behind 1000 bytes/s once the grace is over
	stop := paceWatch(Pace{Grace: 50 * time.Millisecond, MinRate: 1000}, time.Now(), &n, cancel)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a request behind its pace was not cut off")
	}
	if !errors.Is(context.Cause(ctx), ErrTooSlow) {
		t.Fatalf("cause %v, want ErrTooSlow", context.Cause(ctx))
	}
	if !stop() {
		t.Fatal("stop did not report the cut-off")
	}
}

// TestPaceWatchStoppedNeverCancels: once stop returned false, the request
// is never cancelled, however far behind its count then falls.
func TestPaceWatchStoppedNeverCancels(t *testing.T) {
	var cancelled atomic.Bool
	var n atomic.Int64
	stop := paceWatch(Pace{Max: time.Millisecond}, time.Now(), &n, func(error) { cancelled.Store(true) })
	if stop() {
		t.Fatal("stop reported a cut-off before any check")
	}
	time.Sleep(2 * paceCheck)
	if cancelled.Load() {
		t.Fatal("a stopped watch cancelled its request")
	}
}

// TestPaceWatchStartsNoGoroutine: a request read within one check interval
// (a CI runner's commands) costs the watch no goroutine; one per request
// was among the few costs a herd of runners multiplies.
func TestPaceWatchStartsNoGoroutine(t *testing.T) {
	created := func() uint64 {
		s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
		metrics.Read(s)
		if s[0].Value.Kind() != metrics.KindUint64 {
			t.Skip("no goroutine creation count in this Go")
		}
		return s[0].Value.Uint64()
	}
	var n atomic.Int64
	pace := Pace{Grace: time.Minute, MinRate: 1, Max: time.Hour}
	before := created()
	for i := 0; i < 100; i++ {
		paceWatch(pace, time.Now(), &n, func(error) {})()
	}
	if got := created() - before; got >= 10 {
		t.Fatalf("100 watches started and stopped created %d goroutines", got)
	}
}
