package gitexec

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestDeadlineOnCancelNotAfterRelease cancels right before release, the
// race in which a bare AfterFunc's deadline lands after the handler
// returned (CI saw HTTP/2's writer panic on it).
func TestDeadlineOnCancelNotAfterRelease(t *testing.T) {
	var late atomic.Int64
	for range 5000 {
		ctx, cancel := context.WithCancel(context.Background())
		var released atomic.Bool
		release := DeadlineOnCancel(ctx, func(time.Time) error {
			if released.Load() {
				late.Add(1)
			}
			return nil
		})
		cancel()
		release()
		released.Store(true)
	}
	time.Sleep(100 * time.Millisecond) // let any straggling callback run
	if n := late.Load(); n > 0 {
		t.Fatalf("the deadline was set %d times after release returned", n)
	}
}

func TestDeadlineOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	sets := make(chan time.Time, 4)
	release := DeadlineOnCancel(ctx, func(d time.Time) error { sets <- d; return nil })
	cancel()
	select {
	case d := <-sets:
		if d.IsZero() || time.Since(d) > time.Minute {
			t.Fatalf("a cancel set the deadline %v, want now", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancel did not set the deadline")
	}
	release()
	if len(sets) != 0 {
		t.Fatalf("release after a cancel changed the deadline to %v; it should stay in the past", <-sets)
	}

	release = DeadlineOnCancel(context.Background(), func(d time.Time) error { sets <- d; return nil })
	release()
	if d := <-sets; !d.IsZero() {
		t.Fatalf("release without a cancel set %v, want the deadline cleared", d)
	}
}
